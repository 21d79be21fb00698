"""Wide & Deep in OneFlow (``wide_deep`` holds the sizes and the arithmetic): the model of
``torch.build`` rebuilt from ``oneflow.nn``, layer for layer under the same names
(the alignment test loads torch's weights into it by name and compares the loss), its power-law
ids and the recipe.

Under an ``emb`` layout the recipe names its tables (``Parts.plans["emb"]``: the ``nn.Embedding``
modules), and the OneFlow adapter makes them global tensors split over the ranks by rows, as
OneFlow-Benchmark's Wide & Deep does (``frameworks/oneflow/embedding.py``); the model itself is
the same, unsharded one.

OneFlow is imported inside functions only: the pytest side imports this module and has no
OneFlow.
"""

from __future__ import annotations

from typing import Any

from ...core.workload import BuildContext, Parts
from . import SCATTER, WideDeepShape

TABLES = ("wide_embedding", "deep_embedding")  # what an emb layout splits


def build(shape: WideDeepShape) -> Any:
    """The model: ``model(dense, wide_ids, deep_ids)`` -> one logit a sample (torch's
    ``build``: tables uniform in (-0.05, 0.05), the tower Xavier-uniform with zero biases)."""
    import oneflow as flow

    nn: Any = flow.nn

    class WideDeep(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.wide_embedding = nn.Embedding(shape.vocab, 1)
            self.deep_embedding = nn.Embedding(shape.vocab, shape.deep_width)
            layers: list[Any] = []
            width = shape.tower_input
            for _ in range(shape.hidden_layers):
                layers += [nn.Linear(width, shape.hidden_size), nn.ReLU(),
                           nn.Dropout(shape.dropout)]
                width = shape.hidden_size
            self.tower = nn.Sequential(*layers)
            self.deep_scores = nn.Linear(width, 1)
            with flow.no_grad():
                for table in (self.wide_embedding, self.deep_embedding):
                    nn.init.uniform_(table.weight, -0.05, 0.05)
                for module in self.modules():
                    if isinstance(module, nn.Linear):
                        nn.init.xavier_uniform_(module.weight)
                        nn.init.zeros_(module.bias)

        def forward(self, dense: Any, wide_ids: Any, deep_ids: Any) -> Any:
            wide = self.wide_embedding(wide_ids).sum(dim=2).sum(dim=1)
            deep = flow.cat([self.deep_embedding(deep_ids).flatten(1), dense], dim=1)
            return wide + self.deep_scores(self.tower(deep)).squeeze(-1)

    return WideDeep()


def ids_of(shape: WideDeepShape, uniform: Any, first_slot: int) -> Any:
    """Ids in [0, vocab) from ``uniform`` (float64 in [0, 1), ``batch x slots``): torch's
    ``power_law_ids`` (a power law's inverse CDF on [1, vocab], floored: exponent ``zipf``;
    slot ``s``'s hot rows moved by id -> (id * SCATTER + s * (vocab // slots in all)) mod
    vocab)."""
    import oneflow as flow

    vocab, s = shape.vocab, shape.zipf
    if abs(s - 1.0) < 1e-9:
        x = flow.pow(flow.full_like(uniform, float(vocab)), uniform)
    else:
        top = float(vocab) ** (1.0 - s)
        x = flow.pow(1.0 + uniform * (top - 1.0), 1.0 / (1.0 - s))
    rank = x.floor().to(flow.int64).clamp(1, vocab) - 1
    every = shape.deep_slots + shape.wide_slots
    slots = uniform.shape[1]
    offsets = flow.arange(first_slot, first_slot + slots, device=uniform.device) * (
        vocab // every)
    return (rank * SCATTER + offsets) % vocab


def recipe(ctx: BuildContext) -> Parts:
    import oneflow as flow

    shape = WideDeepShape.of(ctx.sizes)
    batch, device = ctx.batch_size, ctx.device
    # The same weights on every rank, whatever the rank's own seed (the adapter seeds the
    # data after the recipe).
    flow.manual_seed(ctx.seed)
    model = build(shape)
    generator = flow.Generator(device=flow.device(device).type)
    generator.manual_seed(ctx.seed * 1_000_003 + ctx.rank)
    dense = flow.rand(batch, shape.dense_fields, generator=generator, device=device)

    def draw(slots: int, first_slot: int) -> Any:
        uniform = flow.rand(batch, slots, generator=generator, device=device,
                            dtype=flow.float64)
        return ids_of(shape, uniform, first_slot)

    def fresh_ids() -> Any:  # the rows a step touches move as a click log's do
        return (dense, draw(shape.wide_slots, shape.deep_slots), draw(shape.deep_slots, 0))

    half = flow.full((batch,), 0.5, device=device)

    def fresh_labels() -> Any:
        return flow.bernoulli(half, generator=generator)

    def loss(logits: Any, clicks: Any) -> Any:
        return flow.nn.functional.binary_cross_entropy_with_logits(logits.float(), clicks)

    emb = ctx.layout is not None and ctx.layout.uses("emb")
    return Parts(model=model, inputs=fresh_ids, targets=fresh_labels, loss=loss,
                 plans={"emb": list(TABLES)} if emb else None)
