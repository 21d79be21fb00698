"""Wide & Deep in torch (``wide_deep`` holds the sizes and the arithmetic): the model, its
power-law ids and the recipe."""

from __future__ import annotations

from typing import Any

from ...core.workload import BuildContext, Parts
from . import SCATTER, WideDeepShape


def build(shape: WideDeepShape, device: str | None = None) -> Any:
    """The model: ``model(dense, wide_ids, deep_ids)`` -> one logit a sample."""
    import torch

    class WideDeep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wide_embedding = torch.nn.Embedding(shape.vocab, 1, device=device)
            self.deep_embedding = torch.nn.Embedding(shape.vocab, shape.deep_width,
                                                     device=device)
            layers: list[torch.nn.Module] = []
            width = shape.tower_input
            for _ in range(shape.hidden_layers):
                layers += [torch.nn.Linear(width, shape.hidden_size, device=device),
                           torch.nn.ReLU(), torch.nn.Dropout(shape.dropout)]
                width = shape.hidden_size
            self.tower = torch.nn.Sequential(*layers)
            self.deep_scores = torch.nn.Linear(width, 1, device=device)
            with torch.no_grad():
                for table in (self.wide_embedding, self.deep_embedding):
                    table.weight.uniform_(-0.05, 0.05)
                for module in self.modules():
                    if isinstance(module, torch.nn.Linear):
                        torch.nn.init.xavier_uniform_(module.weight)
                        torch.nn.init.zeros_(module.bias)

        def forward(self, dense: Any, wide_ids: Any, deep_ids: Any) -> Any:
            wide = self.wide_embedding(wide_ids).sum(dim=(1, 2))
            deep = torch.cat([self.deep_embedding(deep_ids).flatten(1), dense], dim=1)
            return wide + self.deep_scores(self.tower(deep)).squeeze(-1)

    return WideDeep()


def build_tables(shape: WideDeepShape, plain: Any) -> Any:
    """The model of ``build`` with its tables as one TorchRec ``EmbeddingBagCollection``
    (what the ``emb`` layouts shard): a feature per slot, the deep slots sharing the deep table
    and the wide slots the wide one, each slot's one id pooled alone. The tables hold ``plain``'s
    weights (the same tensors) and the tower is ``plain``'s."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    deep_names = [f"deep{slot}" for slot in range(shape.deep_slots)]
    wide_names = [f"wide{slot}" for slot in range(shape.wide_slots)]

    class WideDeepTables(torch.nn.Module):
        # ``plain`` is an argument, not a closure's cell: the class would keep the unsharded
        # tables alive beside their shards.
        def __init__(self, plain: Any) -> None:
            super().__init__()
            weight = plain.deep_embedding.weight
            self.tables = EmbeddingBagCollection(device=torch.device("meta"), tables=[
                EmbeddingBagConfig(name="deep", embedding_dim=shape.deep_width,
                                   num_embeddings=shape.vocab, feature_names=deep_names),
                EmbeddingBagConfig(name="wide", embedding_dim=1, num_embeddings=shape.vocab,
                                   feature_names=wide_names)])
            self.tables.embedding_bags["deep"].weight = weight
            self.tables.embedding_bags["wide"].weight = plain.wide_embedding.weight
            self.tower = plain.tower
            self.deep_scores = plain.deep_scores
            self.keys = deep_names + wide_names

        def forward(self, dense: Any, wide_ids: Any, deep_ids: Any) -> Any:
            batch = dense.shape[0]
            ids = torch.cat([deep_ids, wide_ids], dim=1)
            features = KeyedJaggedTensor.from_lengths_sync(
                keys=self.keys, values=ids.t().reshape(-1),
                lengths=torch.ones(batch * len(self.keys), dtype=torch.int32,
                                   device=ids.device))
            pooled = self.tables(features).to_dict()
            deep = torch.cat([*(pooled[name] for name in deep_names), dense], dim=1)
            wide = torch.cat([pooled[name] for name in wide_names], dim=1).sum(dim=1)
            return wide + self.deep_scores(self.tower(deep)).squeeze(-1)

    return WideDeepTables(plain)


def power_law_ids(shape: WideDeepShape, batch: int, slots: int, first_slot: int,
                  generator: Any, device: str, out: Any = None) -> Any:
    """``batch`` x ``slots`` ids in [0, vocab): each a power law's draw over the rows (the
    continuous law's inverse CDF on [1, vocab], floored: exponent ``zipf``), slot ``s``'s hot
    rows moved by id -> (id * SCATTER + s * (vocab // slots in all)) mod vocab, a permutation
    of the rows."""
    import torch

    vocab, s = shape.vocab, shape.zipf
    u = torch.rand(batch, slots, generator=generator, device=device, dtype=torch.float64)
    if abs(s - 1.0) < 1e-9:
        x = torch.pow(float(vocab), u)
    else:
        top = float(vocab) ** (1.0 - s)
        x = torch.pow(1.0 + u * (top - 1.0), 1.0 / (1.0 - s))
    rank = x.floor().long().clamp_(1, vocab) - 1
    every = shape.deep_slots + shape.wide_slots
    offsets = torch.arange(first_slot, first_slot + slots, device=device) * (vocab // every)
    ids = (rank * SCATTER + offsets) % vocab
    return ids if out is None else out.copy_(ids)


def recipe(ctx: BuildContext) -> Parts:
    import torch

    shape = WideDeepShape.of(ctx.sizes)
    batch, device = ctx.batch_size, ctx.device
    # The same weights on every rank, whatever the rank's own seed; none at all on the meta
    # device (FLOPs are counted there, in rank 0 beside its own model).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed)
        model = build(shape, device="meta" if device == "meta" else None)
    if ctx.layout is not None and ctx.layout.uses("emb") and ctx.layout.options_of(
            "emb") != ["sparse"]:  # emb-sparse: torch's own nn.Embedding, made sparse
        model = build_tables(shape, model)
    generator = None
    if device != "meta":
        generator = torch.Generator(device=device)
        generator.manual_seed(ctx.seed * 1_000_003 + ctx.rank)
    dense = torch.rand(batch, shape.dense_fields, device=device, generator=generator)
    wide = power_law_ids(shape, batch, shape.wide_slots, shape.deep_slots, generator, device)
    deep = power_law_ids(shape, batch, shape.deep_slots, 0, generator, device)
    labels = torch.empty(batch, device=device)

    def fresh_ids() -> Any:  # the rows a step touches move as a click log's do
        power_law_ids(shape, batch, shape.wide_slots, shape.deep_slots, generator, device, wide)
        power_law_ids(shape, batch, shape.deep_slots, 0, generator, device, deep)
        return dense, wide, deep

    def fresh_labels() -> Any:
        return labels.bernoulli_(0.5, generator=generator)

    def loss(logits: Any, clicks: Any) -> Any:
        return torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), clicks)

    return Parts(model=model, inputs=fresh_ids, targets=fresh_labels, loss=loss)
