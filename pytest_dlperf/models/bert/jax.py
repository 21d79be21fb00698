"""BERT-base pretraining in JAX: torch's ``BertForPreTraining`` as a Flax NNX module.

Why written here: Flax ships no BERT (Hugging Face's linen port left with transformers 5), so
it is written as ``transformers`` writes it, under its attribute names, as ``mxnet`` is, and
the tests load torch's weights into it to compare outputs. What it matches, not Flax's defaults:

- exact (erf) GELU (``jax.nn.gelu``'s default is tanh's); LayerNorm epsilon 1e-12 (Flax's is
  1e-6), its variance in two passes as torch's (not Flax's ``E[x^2] - E[x]^2``);
- weights from a plain N(0, 0.02) (Flax's are LeCun normal and variance scaling), biases zero,
  LayerNorm scales one; the word embeddings' padding row (id 0) zero at start and given no
  gradient by the lookup, as torch's ``padding_idx`` (the tied decoder still trains it);
- the decoder tied to the word embeddings: the head reads the embedding's ``Param`` where it
  lives (no second reference to it): one parameter, one name;
- dropout 0.1 on the embeddings, the attention probabilities and every residual branch.

Dropout: each ``nnx.Dropout`` forks its own stream (``nnx.RngKey``, ``nnx.RngCount``) from
``nnx.Rngs(dropout=seed)`` and in training mode (``model()``'s; ``model.eval()`` turns it off)
draws ``fold_in(key, count)`` and counts on: state that a step traced over ``nnx.split(model,
nnx.Param, ...)`` hands back out (``nnx.state(model, nnx.Not(nnx.Param))``), or it draws the
same masks every step; merged with ``copy=True``, as ``nnx.merge`` otherwise reuses the
Variables the trace made, and a count written under ``jax.grad`` raises ``TraceContextError``.

Precision: ``dtype`` (AMP: "bfloat16") computes every ``Linear`` and the residual stream;
parameters, embedding sums, LayerNorm's statistics and the attention softmax are float32; the
logits come out in ``dtype``, the loss casts them to float32 (a 30522-way softmax in bf16 loses
the loss). Inputs are int32. JAX and Flax are imported inside functions only (pytest has none).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from ...core.workload import BuildContext, Parts
from .. import _jax_torch
from . import BERT_BASE, BertShape

PADDING_ID = 0  # BertConfig's pad_token_id: the word embeddings' padding_idx
# (torch's leaf, Flax's attribute, the axes of Flax's array in torch's layout: None = as is)
OWN_BIAS = (("bias", "bias", None),)  # the masked-LM head's own: the decoder's bias
TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias"}
EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm")
LAYER_PARTS = ("attention.self.query", "attention.self.key", "attention.self.value",
               "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
               "output.dense", "output.LayerNorm")


def model(shape: BertShape = BERT_BASE, *, seed: int = 0, dtype: str = "float32") -> Any:
    """BERT with both pretraining heads, initialized as transformers' from ``seed``, computing
    in ``dtype`` (float32 parameters), in training mode: ``model(input_ids, token_type_ids,
    attention_mask, masked_positions)`` -> ``(mlm_logits [B, P, vocab], nsp_logits [B, 2])``."""
    import jax.numpy as jnp
    from flax import nnx

    bert = _model_classes().BertForPreTraining(shape, jnp.dtype(dtype),
                                               nnx.Rngs(params=seed, dropout=seed))
    bert.train()
    return bert


def recipe(ctx: BuildContext, shape: BertShape = BERT_BASE) -> Parts:
    """BERT-base (``shape``: the tests' tiny ones) on synthetic sentences resident on the
    default device, labels drawn every step; the loss is ``pretraining_loss``."""
    import jax
    import jax.numpy as jnp

    batch, seq = ctx.batch_size, int(ctx.sizes["seq_length"])
    predictions = int(ctx.sizes["max_predictions_per_seq"])
    bert = model(shape, seed=ctx.seed, dtype=ctx.amp_dtype)
    # One model on every rank (the seed); each rank's batch its own (the rank folded in).
    ids, segments, order, labels = jax.random.split(
        jax.random.fold_in(jax.random.key(ctx.seed), ctx.rank), 4)
    vocab = shape.vocab_size
    input_ids = jax.random.randint(ids, (batch, seq), 0, vocab, jnp.int32)
    segment_ids = jax.random.randint(segments, (batch, seq), 0, shape.type_vocab_size, jnp.int32)
    # Distinct positions per sequence, in order, as BERT's data pipeline writes them.
    positions = jnp.argsort(jax.random.uniform(order, (batch, seq)), axis=1)[:, :predictions]
    positions = jnp.sort(positions, axis=1).astype(jnp.int32)
    keys = [labels]

    def fresh_labels() -> Any:
        # A new key per call, outside the traced step (split in a trace, it leaks a tracer).
        keys[0], mlm_key, nsp_key = jax.random.split(keys[0], 3)
        return (jax.random.randint(mlm_key, (batch, predictions), 0, vocab, jnp.int32),
                jax.random.randint(nsp_key, (batch,), 0, 2, jnp.int32))

    inputs = (input_ids, segment_ids, jnp.ones((batch, seq), jnp.int32), positions)  # all attend
    return Parts(model=bert, inputs=inputs, targets=fresh_labels, loss=pretraining_loss)


def pretraining_loss(outputs: Any, targets: Any) -> Any:
    """Masked-LM (the mean over batch x positions) plus next-sentence cross-entropy of the
    model's ``(mlm_logits, nsp_logits)``: a float32 scalar whatever the logits' dtype."""
    import jax.numpy as jnp
    import optax

    return sum(optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels).mean() for logits, labels in zip(outputs, targets))


def named_parameters(model: Any) -> dict[str, Any]:
    """Every parameter under torch's name, in its order (the tied decoder once) and layout."""
    return _jax_torch.named_arrays(torch_variables(model))


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The parameters' shapes under torch's names, in torch's order and layout."""
    return _jax_torch.named_shapes(torch_variables(model))


def load_torch_weights(model: Any, arrays: Mapping[str, Any]) -> None:
    """Set every parameter from torch's arrays by name (``named_parameters()``'s, or a
    ``state_dict()``'s, whose decoder entries must be the tied arrays), in Flax's layout.
    Refuses a missing or extra name and a shape that differs, before setting anything."""
    import numpy as np

    # A state_dict's decoder entries are dropped where they are the tied arrays (else refused).
    arrays = {name: array for name, array in arrays.items()
              if not (name in TIED and TIED[name] in arrays
                      and np.array_equal(array, arrays[TIED[name]]))}
    _jax_torch.load(torch_variables(model), arrays)


def torch_variables(model: Any) -> _jax_torch.Walk:
    """torch's name -> (the ``Param``, the axes to torch's layout), in torch's order (``nnx.state``
    sorts by path); Flax's ``kernel`` (in, out), ``scale`` and ``embedding`` are ``weight``."""
    def layer(path: str) -> Any:  # a torch path is the attribute path; an index an nnx.List's
        return functools.reduce(lambda node, key: node[int(key)] if key.isdigit()
                                else getattr(node, key), path.split("."), model)

    paths = module_paths(len(model.bert.encoder.layer))
    return _jax_torch.walk(((path, layer(path)) for path in paths), own=OWN_BIAS)


def module_paths(num_layers: int) -> list[str]:
    """torch's paths of the modules holding parameters, in its order (own ones first)."""
    return [*(f"bert.embeddings.{name}" for name in EMBEDDINGS),
            *(f"bert.encoder.layer.{i}.{part}" for i in range(num_layers) for part in LAYER_PARTS),
            "bert.pooler.dense", "cls.predictions", "cls.predictions.transform.dense",
            "cls.predictions.transform.LayerNorm", "cls.seq_relationship"]


def exact_gelu(x: Any) -> Any:
    """BERT's GELU: exact (erf), not tanh's approximation (``jax.nn.gelu``'s default)."""
    import jax

    return jax.nn.gelu(x, approximate=False)


def exact_gelu_jvp(primals: Any, tangents: Any) -> Any:
    """Its derivative, Phi(x) + x phi(x), phi with a plain exp: JAX 0.12's own (erfc's, in
    float32 a polynomial of constants) fails ``shard_map``'s check of varying axes."""
    import jax
    import jax.numpy as jnp

    (x,), (dx,) = primals, tangents
    pdf = jnp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return exact_gelu(x), (0.5 * jax.lax.erfc(-x / math.sqrt(2)) + x * pdf) * dx


@functools.cache
def _layers() -> SimpleNamespace:
    """What BERT is made of: Linear, LayerNorm and embedding as it makes them, exact GELU,
    BertSelfOutput / BertOutput (``Residual``), BertIntermediate and BertPooler."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    Module: Any = nnx.Module

    def dense(s: BertShape, width: int, out: int, dtype: Any, rngs: Any) -> Any:
        return nnx.Linear(width, out, dtype=dtype, param_dtype=jnp.float32,
                          kernel_init=jax.nn.initializers.normal(s.initializer_range),
                          rngs=rngs)

    def layer_norm(s: BertShape, dtype: Any, rngs: Any) -> Any:
        return nnx.LayerNorm(s.hidden_size, epsilon=s.layer_norm_eps, dtype=dtype,
                             param_dtype=jnp.float32, use_fast_variance=False, rngs=rngs)

    def embedding(s: BertShape, num: int, rngs: Any, padding: bool = False) -> Any:
        normal = jax.nn.initializers.normal(s.initializer_range)

        def init(key: Any, shape: Any, dtype: Any = jnp.float32) -> Any:
            table = normal(key, shape, dtype)
            return table.at[PADDING_ID].set(0.0) if padding else table  # padding_idx's row

        # Looked up in float32: the sum of three lookups is LayerNorm's input.
        return nnx.Embed(num, s.hidden_size, dtype=jnp.float32, param_dtype=jnp.float32,
                         embedding_init=init, rngs=rngs)

    gelu = jax.custom_jvp(exact_gelu)
    gelu.defjvp(exact_gelu_jvp)

    class Residual(Module):  # type: ignore[misc]
        """BertSelfOutput and BertOutput: dense, dropout, residual, LayerNorm."""

        def __init__(self, s: BertShape, width: int, dtype: Any, rngs: Any) -> None:
            self.dense = dense(s, width, s.hidden_size, dtype, rngs)
            self.LayerNorm = layer_norm(s, dtype, rngs)
            self.dropout = nnx.Dropout(s.dropout, rngs=rngs)  # its own fork

        def __call__(self, x: Any, residual: Any) -> Any:
            return self.LayerNorm(self.dropout(self.dense(x)) + residual)

    class Activated(Module):  # type: ignore[misc]
        """BertIntermediate (GELU) and BertPooler (tanh): ``dense`` and an activation."""

        def __init__(self, s: BertShape, out: int, activation: Any, dtype: Any, rngs: Any) -> None:
            self.dense = dense(s, s.hidden_size, out, dtype, rngs)
            self.activation = activation

        def __call__(self, x: Any) -> Any:
            return self.activation(self.dense(x))

    return SimpleNamespace(dense=dense, layer_norm=layer_norm, embedding=embedding, gelu=gelu,
                           Residual=Residual, Activated=Activated)


@functools.cache
def _encoder_classes() -> SimpleNamespace:
    """BertEncoder and its layers' attention."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    Module: Any = nnx.Module
    L = _layers()

    class SelfAttention(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape, dtype: Any, rngs: Any) -> None:
            self.heads = s.num_heads
            self.query, self.key, self.value = (
                L.dense(s, s.hidden_size, s.hidden_size, dtype, rngs) for _ in range(3))
            self.dropout = nnx.Dropout(s.dropout, rngs=rngs)  # its own fork

        def __call__(self, x: Any, keep: Any) -> Any:
            batch, length, width = x.shape
            q, k, v = (layer(x).reshape(batch, length, self.heads, -1)
                       for layer in (self.query, self.key, self.value))
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
            # Masked keys get float32's lowest score: exp() of it is 0 (softmax in float32).
            scores = jnp.where(keep, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
            probs = self.dropout(jax.nn.softmax(scores, axis=-1).astype(x.dtype))
            return jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, width)

    class Attention(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape, dtype: Any, rngs: Any) -> None:
            self.self = SelfAttention(s, dtype, rngs)
            self.output = L.Residual(s, s.hidden_size, dtype, rngs)

        def __call__(self, x: Any, keep: Any) -> Any:
            return self.output(self.self(x, keep), x)

    class Layer(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape, dtype: Any, rngs: Any) -> None:
            self.attention = Attention(s, dtype, rngs)
            self.intermediate = L.Activated(s, s.intermediate_size, L.gelu, dtype, rngs)
            self.output = L.Residual(s, s.intermediate_size, dtype, rngs)

        def __call__(self, x: Any, keep: Any) -> Any:
            x = self.attention(x, keep)
            return self.output(self.intermediate(x), x)

    class Encoder(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape, dtype: Any, rngs: Any) -> None:
            # nnx.List, not a Python list: Flax 0.12 refuses modules in a plain list.
            self.layer = nnx.List([Layer(s, dtype, rngs) for _ in range(s.num_layers)])

        def __call__(self, x: Any, attention_mask: Any) -> Any:
            keep = (attention_mask > 0)[:, None, None, :]  # [B, S] -> the scores' [B, h, S, S]
            for layer in self.layer:
                x = layer(x, keep)
            return x

    return SimpleNamespace(Encoder=Encoder)


@functools.cache
def _model_classes() -> SimpleNamespace:
    """The embeddings, the pooler, BertPreTrainingHeads and BertForPreTraining."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    Module: Any = nnx.Module
    L = _layers()

    class Embeddings(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape, dtype: Any, rngs: Any) -> None:
            self.word_embeddings = L.embedding(s, s.vocab_size, rngs, padding=True)
            self.position_embeddings = L.embedding(s, s.max_positions, rngs)
            self.token_type_embeddings = L.embedding(s, s.type_vocab_size, rngs)
            self.LayerNorm = L.layer_norm(s, dtype, rngs)
            self.dropout = nnx.Dropout(s.dropout, rngs=rngs)  # its own fork

        def __call__(self, input_ids: Any, token_type_ids: Any) -> Any:
            words = self.word_embeddings(input_ids)
            # torch's padding_idx: the row is read, but its lookups send it no gradient.
            padding = (input_ids == PADDING_ID)[..., None]
            words = jnp.where(padding, jax.lax.stop_gradient(words), words)
            positions = self.position_embeddings.embedding[:input_ids.shape[1]]
            x = words + positions + self.token_type_embeddings(token_type_ids)
            return self.dropout(self.LayerNorm(x))

    class BertModel(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape, dtype: Any, rngs: Any) -> None:
            self.embeddings = Embeddings(s, dtype, rngs)
            self.encoder = _encoder_classes().Encoder(s, dtype, rngs)
            self.pooler = L.Activated(s, s.hidden_size, jnp.tanh, dtype, rngs)

        def __call__(self, input_ids: Any, token_type_ids: Any, attention_mask: Any) -> Any:
            hidden = self.encoder(self.embeddings(input_ids, token_type_ids), attention_mask)
            return hidden, self.pooler(hidden[:, 0])  # the first token's

    class BertForPreTraining(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape, dtype: Any, rngs: Any) -> None:
            self.bert = BertModel(s, dtype, rngs)
            self.cls = _head_classes().PreTrainingHeads(s, dtype, rngs)

        def __call__(self, input_ids: Any, token_type_ids: Any, attention_mask: Any,
                     masked_positions: Any) -> Any:
            hidden, pooled = self.bert(input_ids, token_type_ids, attention_mask)
            masked = jnp.take_along_axis(hidden, masked_positions[..., None], axis=1)
            # The tied decoder: the word embeddings' own Param, read where it lives.
            table = self.bert.embeddings.word_embeddings.embedding[...]
            return self.cls.predictions(masked, table), self.cls.seq_relationship(pooled)

    return SimpleNamespace(BertForPreTraining=BertForPreTraining)


@functools.cache
def _head_classes() -> SimpleNamespace:
    """BertPreTrainingHeads: the masked-LM head and the next-sentence classifier."""
    import jax.numpy as jnp
    from flax import nnx

    Module: Any = nnx.Module
    L = _layers()

    class Transform(Module):  # type: ignore[misc]
        def __init__(self, s: BertShape, dtype: Any, rngs: Any) -> None:
            self.dense = L.dense(s, s.hidden_size, s.hidden_size, dtype, rngs)
            self.LayerNorm = L.layer_norm(s, dtype, rngs)

        def __call__(self, x: Any) -> Any:
            return self.LayerNorm(L.gelu(self.dense(x)))

    class Predictions(Module):  # type: ignore[misc]
        """The masked-LM head; its decoder weight is the word embeddings, passed in."""

        def __init__(self, s: BertShape, dtype: Any, rngs: Any) -> None:
            self.bias = nnx.Param(jnp.zeros((s.vocab_size,), jnp.float32))
            self.transform = Transform(s, dtype, rngs)

        def __call__(self, x: Any, table: Any) -> Any:
            x = self.transform(x)
            return (jnp.einsum("bph,vh->bpv", x, table.astype(x.dtype))
                    + self.bias[...].astype(x.dtype))

    class PreTrainingHeads(Module):  # type: ignore[misc]
        """Called by its parts only, as torch's ``cls``: the module holding them."""

        def __init__(self, s: BertShape, dtype: Any, rngs: Any) -> None:
            self.predictions = Predictions(s, dtype, rngs)
            self.seq_relationship = L.dense(s, s.hidden_size, 2, dtype, rngs)

    return SimpleNamespace(PreTrainingHeads=PreTrainingHeads)
