"""A decoder-only transformer language model (GPT), measured in tokens/s and MFU: its recipe for
torch, and its FLOPs by formula.

Two architectures, chosen by the size ``arch``:

- ``"gpt2"``: GPT-2 (learned positions, LayerNorm, a GELU (tanh) MLP of 4x the width, biases,
  the head tied to the token embedding). The CUDA sizes are GPT-2 small, "124M": 12 layers, 12
  heads, hidden 768, sequence 1024, and a vocabulary of 50,304: GPT-2's 50,257 tokens padded to
  a multiple of 128, as nanoGPT and Megatron-LM (``--make-vocab-size-divisible-by 128``) train
  it. The padding costs 0.1% of the FLOPs and buys a head and embedding that tensor cores take
  in whole tiles, and that tensor parallelism splits evenly over up to 128 ranks (50,257 is
  prime to every degree); random token ids never land on the 47 padding rows. 124,475,904
  parameters (124,439,808 unpadded, the figure ``transformers`` gives ``gpt2``).
- ``"llama"``: Llama's (RMSNorm, a SwiGLU MLP, rotary positions, grouped-query attention, no
  biases, an untied head). ``LLAMA3_8B`` holds Llama 3 8B's sizes (8,030,261,248 parameters),
  for ``measure("torch", "gpt", sizes=LLAMA3_8B, batch_size=1)`` under a sharded layout.

The CPU sizes are a small GPT-2 (vocab 512, 4 layers, hidden 128, 4 heads, sequence 64, batch
4; 867,072 parameters), a step of a few milliseconds.

Throughput is in tokens/s (``units_per_sample="seq_length"``). FLOPs are not counted but given
by formula (``flops_per_sequence``): 6N + 12·L·H·Q·T a token (PaLM's appendix B, torchtitan's
and nanoGPT's count; N the parameters the matrix products use, L layers, H query heads, Q the
head dimension, T the sequence; the full T x T attention, no causal discount, no recomputation
credit). N leaves out the tables that are only looked up (learned positions; Llama's token
embedding) and keeps GPT-2's tied embedding, which the head multiplies by. FlopCounterMode
agrees within the biases (tests/test_gpt.py).

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

torch is imported inside the functions only (this module is imported on the pytest side).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.workload import AdamW, BuildContext, Parts, SizeValue, Workload, WorkloadError

ARCHS = ("gpt2", "llama")
DIMENSIONS = ("vocab_size", "num_layers", "num_heads", "num_kv_heads", "hidden_size",
              "intermediate_size", "seq_length")

GPT2_124M: dict[str, SizeValue] = {
    "arch": "gpt2", "vocab_size": 50304, "num_layers": 12, "num_heads": 12, "num_kv_heads": 12,
    "hidden_size": 768, "intermediate_size": 3072, "seq_length": 1024}
LLAMA3_8B: dict[str, SizeValue] = {
    "arch": "llama", "vocab_size": 128256, "num_layers": 32, "num_heads": 32, "num_kv_heads": 8,
    "hidden_size": 4096, "intermediate_size": 14336, "seq_length": 8192}
CPU_SIZES: dict[str, SizeValue] = {
    "arch": "gpt2", "vocab_size": 512, "num_layers": 4, "num_heads": 4, "num_kv_heads": 4,
    "hidden_size": 128, "intermediate_size": 512, "seq_length": 64}

ROPE_THETA = 500_000.0  # Llama 3's
NORM_EPS = 1e-5


@dataclass(frozen=True)
class GPTShape:
    """A GPT's architecture, read from a case's sizes."""

    arch: str
    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    intermediate_size: int
    seq_length: int

    @classmethod
    def of(cls, sizes: Mapping[str, SizeValue]) -> GPTShape:
        arch = sizes.get("arch")
        if arch not in ARCHS:
            raise WorkloadError(f"gpt: size arch is {arch!r}; give one of {', '.join(ARCHS)}")
        values: dict[str, int] = {}
        for name in DIMENSIONS:
            value = sizes.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"gpt: size {name} must be a positive integer, got "
                                    f"{value!r}")
            values[name] = value
        shape = cls(arch=str(arch), **values)
        if shape.hidden_size % shape.num_heads or shape.num_heads % shape.num_kv_heads:
            raise WorkloadError(
                f"gpt: hidden_size {shape.hidden_size} must be a multiple of num_heads "
                f"{shape.num_heads}, and num_heads of num_kv_heads {shape.num_kv_heads}")
        if shape.arch == "gpt2" and shape.num_kv_heads != shape.num_heads:
            raise WorkloadError("gpt: GPT-2 has no grouped-query attention: num_kv_heads must "
                                f"equal num_heads ({shape.num_heads})")
        if shape.head_dim % 2 and shape.arch == "llama":
            raise WorkloadError(f"gpt: rotary positions need an even head dimension, got "
                                f"{shape.head_dim}")
        return shape

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def tied(self) -> bool:
        return self.arch == "gpt2"

    def parameters(self) -> int:
        """Every trainable parameter, the tied weight once."""
        d, v = self.hidden_size, self.vocab_size
        embeddings = v * d + (self.seq_length * d if self.arch == "gpt2" else 0)
        head = 0 if self.tied else v * d
        return embeddings + self.num_layers * self._block() + self._norm() + head

    def matmul_parameters(self) -> int:
        """N of 6N: the parameters the matrix products use (a tied embedding is the head's
        matrix; a table that is only looked up is not)."""
        d, v = self.hidden_size, self.vocab_size
        return self.num_layers * self._block() + self._norm() + v * d

    def flops_per_token(self) -> int:
        """6N + 12·L·H·Q·T: forward and backward of one token."""
        return (6 * self.matmul_parameters()
                + 12 * self.num_layers * self.num_heads * self.head_dim * self.seq_length)

    def _norm(self) -> int:
        return self.hidden_size * (2 if self.arch == "gpt2" else 1)  # LayerNorm has a bias

    def _block(self) -> int:
        d, f, q = self.hidden_size, self.intermediate_size, self.head_dim
        kv = self.num_kv_heads * q
        bias = self.arch == "gpt2"
        attention = d * d + 2 * d * kv + d * d + (d + 2 * kv + d if bias else 0)
        mlp = (2 * d * f + (f + d if bias else 0) if self.arch == "gpt2"
               else 3 * d * f)
        return attention + mlp + 2 * self._norm()


def flops_per_sequence(sizes: Mapping[str, SizeValue]) -> float:
    """``Workload.flops_per_sample``: a sample is one sequence of ``seq_length`` tokens."""
    shape = GPTShape.of(sizes)
    return float(shape.seq_length * shape.flops_per_token())


def parameter_count(sizes: Mapping[str, SizeValue]) -> int:
    return GPTShape.of(sizes).parameters()


WORKLOAD = Workload(
    name="gpt",
    unit="tokens",
    batch_size={"cuda": 8, "cuda/amp": 16, "cpu": 4},
    sizes={name: (GPT2_124M[name] if GPT2_124M[name] == CPU_SIZES[name]
                  else {"cuda": GPT2_124M[name], "cpu": CPU_SIZES[name]})
           for name in GPT2_124M},
    units_per_sample="seq_length",
    flops_per_sample=flops_per_sequence,
    optimizer=AdamW(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip_norm=1.0),
    layouts=("dp", "fsdp", "tp", "pp"),
    recipes={"torch": "pytest_dlperf.models.gpt:torch_recipe",
             "jax": "pytest_dlperf.models.gpt_jax:recipe"},
)


# -- torch ------------------------------------------------------------------------------------

@functools.cache
def _torch_classes() -> Any:
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


def torch_model(shape: GPTShape, device: str | None = None) -> Any:
    """The GPT of ``shape`` (on ``device``: "meta" builds it without memory)."""
    import torch

    with torch.device(device or "cpu"):
        return _torch_classes()(shape)


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


def pipeline_split(shape: GPTShape, stages: int) -> list[str]:
    """The blocks where stages 2.. begin, ``stages`` of about equal blocks (the embedding in
    the first, the norm and head in the last)."""
    if stages > shape.num_layers:
        raise WorkloadError(f"gpt: {stages} pipeline stages need at least as many layers; "
                            f"the model has {shape.num_layers}")
    return [f"layers.{i * shape.num_layers // stages}" for i in range(1, stages)]


def check_tp(shape: GPTShape, degree: int) -> None:
    for what, value in (("num_heads", shape.num_heads), ("num_kv_heads", shape.num_kv_heads),
                        ("vocab_size", shape.vocab_size),
                        ("intermediate_size", shape.intermediate_size)):
        if value % degree:
            raise WorkloadError(f"gpt: tensor parallelism of degree {degree} splits {what} "
                                f"({value}) evenly only where it divides it")


def torch_recipe(ctx: BuildContext) -> Parts:
    import torch

    shape = GPTShape.of(ctx.sizes)
    batch, seq, vocab = ctx.batch_size, shape.seq_length, shape.vocab_size
    # The same weights on every rank, whatever the rank's own seed: tensor parallelism leaves
    # the norms and GPT-2's positions replicated, as they are built, never synchronized.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed)
        model = torch_model(shape)
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
