"""The GPT's torch classes and recipe (the sizes, the shape's arithmetic and the workload are
``gpt``'s).

Under a layout the recipe returns the whole model and says how to cut it: the blocks are an
``nn.ModuleList`` named ``layers`` (FSDP2's units by default), its ``tp`` plan is torchtitan's plan
for ``parallelize_module`` (attention reshapes with ``view(b, t, -1, head_dim)``, so a rank's
shard of heads needs nothing else), its ``pp`` plan starts the stages at evenly spaced
blocks, the embedding in the first and the final norm and head in the last. GPT-2's tied head
multiplies by the embedding's weight itself: under tensor parallelism a DTensor sharded over
the vocabulary, like the ``ColwiseParallel`` head Llama gets.

Inputs are random token ids resident on the device; the targets are drawn afresh every step (a
language model memorizes a fixed batch), both from a generator seeded by the replica, so that
the tensor- and pipeline-parallel ranks of one replica train on the same tokens. The algorithm
is GPT-3's and nanoGPT's: AdamW, betas (0.9, 0.95), weight decay 0.1 (not on biases and norms),
clipping at 1.0, a fixed learning rate of 3e-4.

torch is imported inside the functions only (the workload names this module's recipe on the
pytest side).
"""

from __future__ import annotations

import functools
from typing import Any

from ...core.workload import BuildContext, Parts
from . import NORM_EPS, ROPE_THETA, GPTShape, check_tp, pipeline_split


@functools.cache
def _classes() -> Any:
    """The torch modules, defined once torch is imported (not at this module's import)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    def rotate(x: Any) -> Any:
        """Rotary positions on ``[b, t, heads, head_dim]``, pairs of adjacent channels (Llama's
        complex form); the angles are computed here, cheap beside the products, so that no
        stage of a pipeline needs a buffer another one holds."""
        t, q = x.size(1), x.size(-1)
        inverse = ROPE_THETA ** -(torch.arange(0, q, 2, device=x.device, dtype=torch.float32)
                                  / q)
        angles = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), inverse)
        cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
        pairs = x.float().unflatten(-1, (-1, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        turned = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return turned.flatten(-2).type_as(x)

    class Attention(nn.Module):
        def __init__(self, shape: GPTShape) -> None:
            super().__init__()
            d, q, bias = shape.hidden_size, shape.head_dim, shape.arch == "gpt2"
            self.head_dim, self.rotary = q, shape.arch == "llama"
            self.wq = nn.Linear(d, shape.num_heads * q, bias=bias)
            self.wk = nn.Linear(d, shape.num_kv_heads * q, bias=bias)
            self.wv = nn.Linear(d, shape.num_kv_heads * q, bias=bias)
            self.wo = nn.Linear(shape.num_heads * q, d, bias=bias)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            # -1 heads: under tensor parallelism this rank's shard of them.
            q = self.wq(x).view(b, t, -1, self.head_dim)
            k = self.wk(x).view(b, t, -1, self.head_dim)
            v = self.wv(x).view(b, t, -1, self.head_dim)
            if self.rotary:
                q, k = rotate(q), rotate(k)
            groups = q.size(2) // k.size(2)
            if groups > 1:  # grouped-query attention: each key/value head serves a group
                k = k.repeat_interleave(groups, dim=2)
                v = v.repeat_interleave(groups, dim=2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            return self.wo(y.transpose(1, 2).reshape(b, t, -1))

    class FeedForward(nn.Module):
        def __init__(self, shape: GPTShape) -> None:
            super().__init__()
            d, f, bias = shape.hidden_size, shape.intermediate_size, shape.arch == "gpt2"
            self.swiglu = shape.arch == "llama"
            self.w1 = nn.Linear(d, f, bias=bias)
            self.w2 = nn.Linear(f, d, bias=bias)
            if self.swiglu:
                self.w3 = nn.Linear(d, f, bias=False)

        def forward(self, x: Any) -> Any:
            if self.swiglu:
                return self.w2(F.silu(self.w1(x)) * self.w3(x))
            return self.w2(F.gelu(self.w1(x), approximate="tanh"))

    def norm(shape: GPTShape) -> Any:
        if shape.arch == "gpt2":
            return nn.LayerNorm(shape.hidden_size, eps=NORM_EPS)
        return nn.RMSNorm(shape.hidden_size, eps=NORM_EPS)

    class Block(nn.Module):
        def __init__(self, shape: GPTShape) -> None:
            super().__init__()
            self.attention_norm, self.attention = norm(shape), Attention(shape)
            self.ffn_norm, self.feed_forward = norm(shape), FeedForward(shape)

        def forward(self, x: Any) -> Any:
            x = x + self.attention(self.attention_norm(x))
            return x + self.feed_forward(self.ffn_norm(x))

    class TiedHead(nn.Module):
        """GPT-2's head: the logits are the hidden states times the token embedding's weight,
        read from the embedding at every call (FSDP and tensor parallelism replace it). It
        holds no parameter, so nothing counts or shards it twice."""

        def __init__(self, embedding: Any) -> None:
            super().__init__()
            object.__setattr__(self, "embedding", embedding)  # not a submodule of the head

        def forward(self, h: Any) -> Any:
            embedding: Any = self.embedding
            weight: Any = embedding.weight
            if type(weight).__name__ == "DTensor":  # tensor parallel: vocabulary-sharded rows
                from torch.distributed.tensor import DTensor, Replicate

                replicated = DTensor.from_local(h, weight.device_mesh, [Replicate()],
                                                run_check=False)
                logits: Any = F.linear(replicated, weight)
                return logits.full_tensor()
            return F.linear(h, weight)

    class GPT(nn.Module):
        def __init__(self, shape: GPTShape) -> None:
            super().__init__()
            d = shape.hidden_size
            self.tok_embeddings = nn.Embedding(shape.vocab_size, d)
            self.pos_embeddings = (nn.Embedding(shape.seq_length, d) if shape.arch == "gpt2"
                                   else None)
            self.layers = nn.ModuleList(Block(shape) for _ in range(shape.num_layers))
            self.norm = norm(shape)
            self.output = (TiedHead(self.tok_embeddings) if shape.tied
                           else nn.Linear(d, shape.vocab_size, bias=False))
            self._initialize(shape)

        def _initialize(self, shape: GPTShape) -> None:
            """GPT-2's: N(0, 0.02), the projections into the residual stream scaled by
            1/sqrt(2 L), zero biases."""
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    nn.init.constant_(p, 0.0 if name.endswith("bias") else 1.0)
                    continue
                std = 0.02
                if name.endswith(("wo.weight", "w2.weight")):
                    std /= (2 * shape.num_layers) ** 0.5
                nn.init.normal_(p, std=std)

        def forward(self, tokens: Any) -> Any:
            h = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(torch.arange(tokens.size(1), device=tokens.device))
            for layer in self.layers:
                h = layer(h)
            return self.output(self.norm(h))

    return GPT


def build(shape: GPTShape, device: str | None = None) -> Any:
    """The GPT of ``shape`` (on ``device``: "meta" builds it without memory)."""
    import torch

    with torch.device(device or "cpu"):
        return _classes()(shape)


def tp_plan(shape: GPTShape) -> dict[str, Any]:
    """torchtitan's tensor-parallel plan: the embedding's rows (the vocabulary) split with its
    input replicated, the attention's Q/K/V and the MLP's w1 (w3) by columns (heads and hidden
    units), their output projections by rows, Llama's head by columns with its logits gathered
    (GPT-2's tied head follows its embedding)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate())}
    for i in range(shape.num_layers):
        at = f"layers.{i}"
        for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1"):
            plan[f"{at}.{name}"] = ColwiseParallel()
        plan[f"{at}.attention.wo"] = RowwiseParallel()
        plan[f"{at}.feed_forward.w2"] = RowwiseParallel()
        if shape.arch == "llama":
            plan[f"{at}.feed_forward.w3"] = ColwiseParallel()
    if not shape.tied:
        plan["output"] = ColwiseParallel(output_layouts=Replicate())
    return plan


def recipe(ctx: BuildContext) -> Parts:
    import torch

    shape = GPTShape.of(ctx.sizes)
    batch, seq, vocab = ctx.batch_size, shape.seq_length, shape.vocab_size
    # The same weights on every rank, whatever the rank's own seed: tensor parallelism leaves
    # the norms and GPT-2's positions replicated, as they are built, never synchronized.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed)
        model = build(shape)
    layout = ctx.layout
    # The ranks of one replica (tensor- and pipeline-parallel) draw the same tokens.
    replica = ctx.rank if layout is None else layout.data_rank(ctx.rank)
    generator = None
    if ctx.device != "meta":
        generator = torch.Generator(device=ctx.device)
        generator.manual_seed(ctx.seed * 1_000_003 + replica)
    tokens = torch.randint(0, vocab, (batch, seq), device=ctx.device, generator=generator)
    targets = torch.empty(batch, seq, dtype=torch.long, device=ctx.device)

    def fresh_targets() -> Any:  # one small kernel, in place
        return torch.randint(0, vocab, targets.shape, out=targets, generator=generator)

    def loss(logits: Any, labels: Any) -> Any:
        # In fp32 whatever the AMP dtype: a 50k-way softmax in fp16 loses the loss.
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                 labels.flatten())

    plan, split = None, None
    if layout is not None and layout.uses("tp"):
        check_tp(shape, layout.tp)
        plan = tp_plan(shape)
    if layout is not None and layout.uses("pp"):
        virtual = 2 if layout.schedule == "interleaved1f1b" else 1
        split = pipeline_split(shape, layout.pp * virtual)
    return Parts(model=model, inputs=tokens, targets=fresh_targets, loss=loss,
                 plans={"tp": plan, "pp": split})
