"""A decoder-only transformer language model (GPT), measured in tokens/s and MFU: its recipe for
torch and JAX, and its FLOPs by formula.

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

torch's classes and recipe are in ``torch``, JAX's in ``jax``; this module holds the
sizes, the shape's arithmetic (parameters, FLOPs, how layouts may cut it) and the workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...core.workload import AdamW, SizeValue, Workload, WorkloadError

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
    recipes={"torch": "pytest_dlperf.models.gpt.torch:recipe",
             "jax": "pytest_dlperf.models.gpt.jax:recipe"},
)


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
