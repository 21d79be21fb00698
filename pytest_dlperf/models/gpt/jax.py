"""The built-in GPT in JAX: ``gpt``'s GPT-2 (``arch="gpt2"``) as a Flax NNX module.

Why written here: Flax ships no GPT-2 to import (its language models are example scripts), and
the Hugging Face port (``FlaxGPT2LMHeadModel``) is linen, is gone from transformers 5, and names
and initializes its parameters as ``transformers`` does, not as ``torch.build``. So the network
is written here, module for module as ``torch._classes`` writes it and under its attribute
names, as ``bert.jax`` is for BERT: the alignment tests (``tests/test_gpt_jax.py``) compare it
with torch's by name and shape and load torch's weights into it to compare logits. Llama's
architecture is not ported: ``model`` and ``recipe`` refuse it.

What it has to match, and why each is not Flax's default:

- GELU with the tanh approximation (``jax.nn.gelu``'s default, torch's ``approximate="tanh"``);
  LayerNorm epsilon 1e-5 (``nnx.LayerNorm``'s is 1e-6), its variance in two passes as torch's
  (Flax's default ``use_fast_variance`` takes ``E[x^2] - E[x]^2``);
- GPT-2's initialization, ``GPT._initialize``: every matrix and table from N(0, 0.02), plain
  normal (Flax's defaults are LeCun normal and variance scaling), the projections into the
  residual stream (``wo``, ``w2``) at 0.02 / sqrt(2 x layers), biases zero, LayerNorm one;
- causal attention at torch's scale, 1/sqrt(head_dim): ``jax.nn.dot_product_attention`` with
  ``is_causal``, the [batch, seq, heads, head_dim] layout torch's ``view`` makes. Its default
  implementation is XLA's (the T x T scores materialized, softmax in float32); cuDNN's fused
  one takes bf16/fp16 only, and the JAX adapter runs CUDA in fp32 alone;
- the head tied to the token embedding: the model multiplies by the embedding's ``Param``
  itself (no second reference to it, which Flax's tree mode refuses): one parameter, one name,
  as torch's ``TiedHead``, which holds none;
- no dropout (torch's model has none).

Precision: ``dtype`` is the compute dtype (AMP: "bfloat16"), in every ``Linear``, the attention
and the head; parameters stay float32 (``param_dtype``). The residual stream stays float32, as
under torch's autocast: the embeddings are looked up in float32 and each branch's bf16 output is
added to it (bf16 + float32 is float32 in JAX as in torch). LayerNorm takes its statistics in
float32 and hands the next product the compute dtype; the logits come out in the compute dtype
and the adapter's default loss (softmax cross-entropy over every token, the mean, in float32:
torch's recipe's) casts them up, so the recipe gives no loss of its own.

Names: ``nnx.state`` lists variables sorted by path, not in the model's order, and Flax calls a
``Linear``'s weight ``kernel`` (laid out (in, out), torch's is (out, in)), a LayerNorm's ``scale``
and an embedding's ``embedding``; ``named_parameters`` walks the model in torch's order and gives
torch's names and layout. torch's model has no buffers (SDPA's ``is_causal`` needs no mask), so
its ``state_dict`` is its parameters. JAX and Flax are imported inside functions only: the
pytest side imports this module and has neither.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping
from operator import attrgetter
from types import SimpleNamespace
from typing import Any

from ...core.workload import BuildContext, Parts, WorkloadError
from .. import _jax_torch
from . import NORM_EPS, GPTShape, check_tp

INIT_STD = 0.02  # GPT-2's, every matrix and table
# A block's modules with parameters, in the order torch's Block registers them.
BLOCK_PARTS = ("attention_norm", "attention.wq", "attention.wk", "attention.wv", "attention.wo",
               "ffn_norm", "feed_forward.w1", "feed_forward.w2")


def model(shape: GPTShape, *, seed: int = 0, dtype: str = "float32") -> Any:
    """GPT-2 of ``shape``, initialized as torch's from ``seed``, computing in ``dtype`` with
    float32 parameters: ``model(tokens [batch, seq] int32)`` returns the logits [batch, seq,
    vocab], each position attending to itself and those before it."""
    if shape.arch != "gpt2":
        raise WorkloadError(f"gpt: the JAX recipe builds GPT-2 only (arch 'gpt2'), not "
                            f"{shape.arch!r}: Llama's architecture is torch's alone for now")
    import jax.numpy as jnp
    from flax import nnx

    return _classes().GPT(shape, jnp.dtype(dtype), nnx.Rngs(params=seed))


def recipe(ctx: BuildContext) -> Parts:
    """The case's GPT on random token ids resident on the default device, fresh random targets
    every step; the loss is the adapter's default (torch's recipe's: every token, float32)."""
    import jax
    import jax.numpy as jnp

    shape = GPTShape.of(ctx.sizes)
    gpt = model(shape, seed=ctx.seed, dtype=ctx.amp_dtype)
    batch, seq, vocab = ctx.batch_size, shape.seq_length, shape.vocab_size
    # The model's seed is every rank's (one model); the data's is folded with the replica, as
    # torch's recipe seeds its generator (under dp and fsdp every rank is a replica of its own).
    replica = ctx.rank if ctx.layout is None else ctx.layout.data_rank(ctx.rank)
    tokens_key, targets_key = jax.random.split(
        jax.random.fold_in(jax.random.key(ctx.seed), replica))
    tokens = jax.random.randint(tokens_key, (batch, seq), 0, vocab, jnp.int32)

    def next_targets(key: Any) -> tuple[Any, Any]:
        key, drawn = jax.random.split(key)
        return key, jax.random.randint(drawn, (batch, seq), 0, vocab, jnp.int32)

    # One dispatch a step: split and randint dispatched eagerly cost ten times as much (157
    # against 16 us on a CPU), beside a CPU step of a few milliseconds.
    draw = jax.jit(next_targets)
    keys = [targets_key]

    def fresh_targets() -> Any:
        # A new key each call for new targets (a fixed batch is memorized); called outside the
        # traced step (a key kept here and split inside a trace would leak a tracer).
        keys[0], targets = draw(keys[0])
        return targets

    plan = None
    if ctx.layout is not None and ctx.layout.uses("tp"):
        check_tp(shape, ctx.layout.tp)
        plan = tp_plan(shape)
    return Parts(model=gpt, inputs=tokens, targets=fresh_targets, plans={"tp": plan})


def tp_plan(shape: GPTShape) -> dict[str, str]:
    """torch's recipe's plan (``torch.tp_plan``: torchtitan's) in the JAX adapter's styles: the
    token embedding's rows (the vocabulary; the tied head follows it), the attention's Q/K/V
    and the MLP's first matrix by columns (heads and hidden units), their output projections
    by rows."""
    plan = {"tok_embeddings": "rowwise"}
    for i in range(shape.num_layers):
        for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1"):
            plan[f"layers.{i}.{name}"] = "colwise"
        for name in ("attention.wo", "feed_forward.w2"):
            plan[f"layers.{i}.{name}"] = "rowwise"
    return plan


def named_parameters(model: Any) -> dict[str, Any]:
    """Every parameter under torch's name, in torch's order (the tied head once, as the token
    embedding, as ``named_parameters()`` gives it), as a JAX array in torch's layout."""
    return _jax_torch.named_arrays(torch_variables(model))


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The parameters' shapes under torch's names, in torch's order and layout; the model may
    be abstract (``nnx.eval_shape``'s: GPT-2 124M counted without its memory)."""
    return _jax_torch.named_shapes(torch_variables(model))


def load_torch_weights(model: Any, arrays: Mapping[str, Any]) -> None:
    """Set every parameter from torch's ``state_dict()`` (or ``named_parameters()``) arrays by
    name, converted to Flax's layout. Refuses a missing or extra name and a shape that
    differs, before setting anything."""
    _jax_torch.load(torch_variables(model), arrays)


def torch_variables(model: Any) -> _jax_torch.Walk:
    """torch's parameter name -> (the Flax ``Param``, the axes that put it in torch's layout),
    in torch's order: each module's own parameters, in the order torch registers them."""
    return _jax_torch.walk(layers(model))


def layers(model: Any) -> Iterator[tuple[str, Any]]:
    """(torch's module path, the module) for every module with parameters, in torch's order;
    the tied head has none."""
    yield "tok_embeddings", model.tok_embeddings
    yield "pos_embeddings", model.pos_embeddings
    for index, block in enumerate(model.layers):
        for part in BLOCK_PARTS:
            yield f"layers.{index}.{part}", attrgetter(part)(block)
    yield "norm", model.norm


@functools.cache
def _layers() -> SimpleNamespace:
    """Linear, LayerNorm and embedding as GPT-2 makes them, defined once JAX is imported."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def linear(width: int, out: int, std: float, dtype: Any, rngs: Any) -> Any:
        return nnx.Linear(width, out, dtype=dtype, param_dtype=jnp.float32,
                          kernel_init=jax.nn.initializers.normal(std), rngs=rngs)  # bias 0

    def layer_norm(s: GPTShape, dtype: Any, rngs: Any) -> Any:
        return nnx.LayerNorm(s.hidden_size, epsilon=NORM_EPS, dtype=dtype,
                             param_dtype=jnp.float32, use_fast_variance=False, rngs=rngs)

    def embedding(rows: int, s: GPTShape, rngs: Any) -> Any:
        # Looked up in float32: the residual stream's dtype, as under torch's autocast.
        return nnx.Embed(rows, s.hidden_size, dtype=jnp.float32, param_dtype=jnp.float32,
                         embedding_init=jax.nn.initializers.normal(INIT_STD), rngs=rngs)

    def residual_std(s: GPTShape) -> float:
        return INIT_STD / math.sqrt(2 * s.num_layers)  # GPT-2's scaled residual projections

    return SimpleNamespace(linear=linear, layer_norm=layer_norm, embedding=embedding,
                           residual_std=residual_std)


@functools.cache
def _block_classes() -> SimpleNamespace:
    """torch's ``Attention``, ``FeedForward`` and ``Block`` as NNX modules."""
    import jax
    from flax import nnx

    Module: Any = nnx.Module
    L = _layers()

    class Attention(Module):  # type: ignore[misc]
        def __init__(self, s: GPTShape, dtype: Any, rngs: Any) -> None:
            d = s.hidden_size
            self.head_dim = s.head_dim
            self.wq = L.linear(d, d, INIT_STD, dtype, rngs)
            self.wk = L.linear(d, d, INIT_STD, dtype, rngs)
            self.wv = L.linear(d, d, INIT_STD, dtype, rngs)
            self.wo = L.linear(d, d, L.residual_std(s), dtype, rngs)

        def __call__(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = (layer(x).reshape(b, t, -1, self.head_dim)
                       for layer in (self.wq, self.wk, self.wv))
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
            return self.wo(y.reshape(b, t, -1))

    class FeedForward(Module):  # type: ignore[misc]
        def __init__(self, s: GPTShape, dtype: Any, rngs: Any) -> None:
            self.w1 = L.linear(s.hidden_size, s.intermediate_size, INIT_STD, dtype, rngs)
            self.w2 = L.linear(s.intermediate_size, s.hidden_size, L.residual_std(s), dtype,
                               rngs)

        def __call__(self, x: Any) -> Any:
            return self.w2(jax.nn.gelu(self.w1(x), approximate=True))

    class Block(Module):  # type: ignore[misc]
        def __init__(self, s: GPTShape, dtype: Any, rngs: Any) -> None:
            self.attention_norm = L.layer_norm(s, dtype, rngs)
            self.attention = Attention(s, dtype, rngs)
            self.ffn_norm = L.layer_norm(s, dtype, rngs)
            self.feed_forward = FeedForward(s, dtype, rngs)

        def __call__(self, x: Any) -> Any:
            x = x + self.attention(self.attention_norm(x))
            return x + self.feed_forward(self.ffn_norm(x))

    return SimpleNamespace(Block=Block)


@functools.cache
def _classes() -> SimpleNamespace:
    """torch's ``GPT`` as an NNX module, its head the token embedding's ``Param``."""
    import jax.numpy as jnp
    from flax import nnx

    Module: Any = nnx.Module
    L, Block = _layers(), _block_classes().Block

    class GPT(Module):  # type: ignore[misc]
        def __init__(self, s: GPTShape, dtype: Any, rngs: Any) -> None:
            self.tok_embeddings = L.embedding(s.vocab_size, s, rngs)
            self.pos_embeddings = L.embedding(s.seq_length, s, rngs)
            # nnx.List, not a Python list: Flax 0.12 refuses modules in a plain list.
            self.layers = nnx.List([Block(s, dtype, rngs) for _ in range(s.num_layers)])
            self.norm = L.layer_norm(s, dtype, rngs)

        def __call__(self, tokens: Any) -> Any:
            h = self.tok_embeddings(tokens) + self.pos_embeddings.embedding[:tokens.shape[1]]
            for layer in self.layers:
                h = layer(h)
            h = self.norm(h)
            # The tied head: the token embedding's own Param, read where it lives.
            table = self.tok_embeddings.embedding[...]
            return jnp.einsum("btd,vd->btv", h, table.astype(h.dtype))

    return SimpleNamespace(GPT=GPT)
