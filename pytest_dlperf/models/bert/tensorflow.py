"""BERT-base pretraining in Keras 3 (TensorFlow backend): the TensorFlow recipe of ``bert``.

Keras ships no BERT, and KerasHub's (a further dependency) has no next-sentence head and keeps
its weights under other names and layouts (fused per-head attention kernels). So the network is
written here from Keras layers, one layer per torch module, named by torch's module path
(``bert.encoder.layer.3.attention.self.query``). That makes the alignment with torch a rename,
not a table: a weight's Keras path ``<torch module>/<kind>`` is its torch parameter name,
``kernel`` transposed to torch's (out, in). A test loads torch's weights
through that rename and checks the logits, which is what pins GELU (exact, not tanh), the
LayerNorm epsilon, the attention mask, the decoder's tie to the word embeddings and the gather.

Under mixed precision the attention scores are softmaxed in float32 (torch's autocast runs
softmax in float32 too), LayerNorm computes in float32 (Keras does), and both logits come out
as float32 so that a 30522-way cross-entropy keeps its precision. The attention mask is added as
``(1 - mask) * -10000`` (Google BERT's constant): far below any score, finite in float16.

Frameworks are imported inside functions only: this module is imported on the pytest side.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ...core.workload import BuildContext, Parts
from . import BERT_BASE, BertShape

MASK_PENALTY = -10000.0  # added to the scores of masked-out keys

# Keras variable kind -> torch parameter suffix; a kernel is also transposed.
_KINDS = {"kernel": "weight", "embeddings": "weight", "gamma": "weight", "beta": "bias",
          "bias": "bias"}


def bert_pretraining(shape: BertShape = BERT_BASE) -> Any:
    """BertForPreTraining with its heads on the masked positions only: four int inputs
    (input_ids, token_type_ids, attention_mask [B, S]; masked_positions [B, P]) with dynamic
    batch and sequence, two float32 outputs (mlm_logits [B, P, vocab], nsp_logits [B, 2])."""
    import keras
    from keras import layers

    names = ("input_ids", "token_type_ids", "attention_mask", "masked_positions")
    inputs = [keras.Input((None,), dtype="int32", name=name) for name in names]
    input_ids, token_type_ids, attention_mask, positions = inputs
    x, word_embeddings = _embeddings(input_ids, token_type_ids, shape)
    for index in range(shape.num_layers):
        x = _encoder_layer(x, attention_mask, f"bert.encoder.layer.{index}", shape)
    pooled = _dense(shape.hidden_size, shape, "bert.pooler.dense", "tanh")(x[:, 0])
    custom = _layer_classes()
    masked = custom.GatherPositions(name="gather_masked_positions")(x, positions)
    masked = _dense(shape.hidden_size, shape, "cls.predictions.transform.dense",
                    _exact_gelu)(masked)
    masked = _layer_norm(shape, "cls.predictions.transform.LayerNorm")(masked)
    mlm = custom.TiedDecoder(word_embeddings, name="cls.predictions")(masked)
    nsp = _dense(2, shape, "cls.seq_relationship")(pooled)
    # float32 layers cast their input: the logits leave the model in float32 under any policy.
    outputs = (layers.Activation("linear", dtype="float32", name="mlm_logits")(mlm),
               layers.Activation("linear", dtype="float32", name="nsp_logits")(nsp))
    return keras.Model(inputs, outputs, name="bert_pretraining")


def _embeddings(input_ids: Any, token_type_ids: Any, shape: BertShape) -> tuple[Any, Any]:
    """The embedded sequence, and the word-embedding layer (the masked-LM decoder's weight)."""
    from keras import layers

    custom = _layer_classes()
    prefix = "bert.embeddings"
    # HF zeroes the padding token's row (pad_token_id 0) after drawing the table.
    words = layers.Embedding(shape.vocab_size, shape.hidden_size,
                             embeddings_initializer=custom.PaddingRowZero(
                                 shape.initializer_range), name=f"{prefix}.word_embeddings")
    positions = layers.Embedding(shape.max_positions, shape.hidden_size,
                                 embeddings_initializer=_normal(shape),
                                 name=f"{prefix}.position_embeddings")
    types = layers.Embedding(shape.type_vocab_size, shape.hidden_size,
                             embeddings_initializer=_normal(shape),
                             name=f"{prefix}.token_type_embeddings")
    position_ids = custom.PositionIds(name=f"{prefix}.position_ids")(input_ids)
    x = words(input_ids) + positions(position_ids) + types(token_type_ids)
    x = _layer_norm(shape, f"{prefix}.LayerNorm")(x)
    return layers.Dropout(shape.dropout, name=f"{prefix}.dropout")(x), words


def _encoder_layer(x: Any, attention_mask: Any, prefix: str, shape: BertShape) -> Any:
    """One post-LN transformer layer, as BertLayer."""
    from keras import layers

    hidden = shape.hidden_size
    q, k, v = (_dense(hidden, shape, f"{prefix}.attention.self.{name}")(x)
               for name in ("query", "key", "value"))
    context = _layer_classes().SelfAttention(shape.num_heads, shape.dropout,
                                             name=f"{prefix}.attention.self")(
        q, k, v, attention_mask)
    out = _dense(hidden, shape, f"{prefix}.attention.output.dense")(context)
    out = layers.Dropout(shape.dropout, name=f"{prefix}.attention.output.dropout")(out)
    x = _layer_norm(shape, f"{prefix}.attention.output.LayerNorm")(out + x)
    out = _dense(shape.intermediate_size, shape, f"{prefix}.intermediate.dense",
                 _exact_gelu)(x)
    out = _dense(hidden, shape, f"{prefix}.output.dense")(out)
    out = layers.Dropout(shape.dropout, name=f"{prefix}.output.dropout")(out)
    return _layer_norm(shape, f"{prefix}.output.LayerNorm")(out + x)


def _exact_gelu(x: Any) -> Any:
    # BERT's "gelu" is the erf form; keras.ops.gelu defaults to the tanh approximation.
    import keras

    return keras.ops.gelu(x, approximate=False)


def _normal(shape: BertShape) -> Any:
    """HF's N(0, initializer_range), a fresh instance per layer: an unseeded Keras initializer
    keeps the seed it drew when made, so a shared one would give every layer the same draw."""
    import keras

    return keras.initializers.RandomNormal(stddev=shape.initializer_range)


def _dense(units: int, shape: BertShape, name: str, activation: Any = None) -> Any:
    from keras import layers

    return layers.Dense(units, activation=activation, kernel_initializer=_normal(shape),
                        bias_initializer="zeros", name=name)


def _layer_norm(shape: BertShape, name: str) -> Any:
    from keras import layers

    return layers.LayerNormalization(epsilon=shape.layer_norm_eps, name=name)


@functools.cache
def _layer_classes() -> Any:
    """The few layers Keras lacks, defined once per process (Keras is imported lazily)."""
    from types import SimpleNamespace

    import keras
    import tensorflow as tf

    class PaddingRowZero(keras.initializers.Initializer):  # type: ignore[misc]
        """N(0, stddev) with row 0 (the padding token's) zero, as HF initializes."""

        def __init__(self, stddev: float) -> None:
            self.normal = keras.initializers.RandomNormal(stddev=stddev)

        def __call__(self, shape: Any, dtype: Any = None) -> Any:
            table = self.normal(shape, dtype)
            rows = tf.range(shape[0])[:, None]
            return tf.where(rows == 0, tf.zeros_like(table), table)

    class PositionIds(keras.layers.Layer):  # type: ignore[misc]
        """0 .. S-1 for a [B, S] input, as [1, S]: position embeddings broadcast over B."""

        def call(self, input_ids: Any) -> Any:
            return tf.range(tf.shape(input_ids)[1])[None, :]

    class SelfAttention(keras.layers.Layer):  # type: ignore[misc]
        """Multi-head scaled dot-product attention of projected q, k, v [B, S, H] under a
        [B, S] 1/0 key mask: BertSelfAttention between its projections and its output."""

        def __init__(self, num_heads: int, dropout: float, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.num_heads = num_heads
            self.dropout = keras.layers.Dropout(dropout)

        def call(self, q: Any, k: Any, v: Any, attention_mask: Any,
                 training: Any = None) -> Any:
            batch, seq = tf.shape(q)[0], tf.shape(q)[1]
            hidden = int(q.shape[-1])
            head_dim = hidden // self.num_heads

            def heads(t: Any) -> Any:  # [B, S, H] -> [B, heads, S, head_dim]
                return tf.transpose(tf.reshape(t, [batch, seq, self.num_heads, head_dim]),
                                    [0, 2, 1, 3])

            scores = tf.matmul(heads(q), heads(k), transpose_b=True)
            scores = tf.cast(scores, tf.float32) * (head_dim ** -0.5)
            penalty = (1.0 - tf.cast(attention_mask, tf.float32)) * MASK_PENALTY
            probs = tf.nn.softmax(scores + penalty[:, None, None, :], axis=-1)
            probs = self.dropout(tf.cast(probs, q.dtype), training=training)
            context = tf.transpose(tf.matmul(probs, heads(v)), [0, 2, 1, 3])
            return tf.reshape(context, [batch, seq, hidden])

    class GatherPositions(keras.layers.Layer):  # type: ignore[misc]
        """hidden [B, S, H] at positions [B, P] -> [B, P, H]."""

        def call(self, hidden: Any, positions: Any) -> Any:
            return tf.gather(hidden, positions, batch_dims=1)

    class TiedDecoder(keras.layers.Layer):  # type: ignore[misc]
        """Logits over the vocabulary: x @ word_embeddings^T + its own bias. The weight is the
        embedding layer's variable (Keras lists it once: its weights are deduplicated)."""

        def __init__(self, embedding: Any, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.embedding = embedding

        def build(self, input_shape: Any) -> None:
            vocab = int(self.embedding.input_dim)
            self.bias = self.add_weight(shape=(vocab,), initializer="zeros", name="bias")

        def call(self, x: Any) -> Any:
            table = tf.cast(self.embedding.embeddings, x.dtype)
            return tf.einsum("bph,vh->bpv", x, table) + tf.cast(self.bias, x.dtype)

    return SimpleNamespace(PaddingRowZero=PaddingRowZero, PositionIds=PositionIds,
                           SelfAttention=SelfAttention, GatherPositions=GatherPositions,
                           TiedDecoder=TiedDecoder)


def _torch_named_weights(model: Any) -> dict[str, Any]:
    """The trainable weights by torch parameter name (a weight's path is
    ``<torch module>/<kind>``)."""
    named = {}
    for weight in model.trainable_weights:
        module, _, kind = weight.path.rpartition("/")
        named[f"{module}.{_KINDS[kind]}"] = weight
    return named


def torch_layout(weight: Any) -> tuple[int, ...]:
    """A Keras weight's shape in torch's layout: a kernel's (in, out) as (out, in)."""
    shape = tuple(int(d) for d in weight.shape)
    return shape[::-1] if weight.path.endswith("/kernel") else shape  # (in, out) -> (out, in)


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The trainable weights under BertForPreTraining's parameter names, in torch's layout:
    what the alignment test compares with ``bert.torch.torch_named_shapes``."""
    return {name: torch_layout(w) for name, w in _torch_named_weights(model).items()}


def load_torch_weights(model: Any, arrays: Mapping[str, Any]) -> None:
    """Set every trainable weight from torch's parameters by name (torch layout). Refuses a
    name either side lacks or a shape that differs: a partial load would test nothing."""
    assign_torch_arrays(_torch_named_weights(model), arrays)


def assign_torch_arrays(named: Mapping[str, Any], arrays: Mapping[str, Any]) -> None:
    """``load_torch_weights`` for any Keras model whose weights ``named`` gives under torch's
    names (Wide & Deep's too)."""
    import numpy as np

    missing, unknown = sorted(set(named) - set(arrays)), sorted(set(arrays) - set(named))
    if missing or unknown:
        raise ValueError(f"torch names without an array: {missing}; arrays the model has no "
                         f"weight for: {unknown}")
    for name, weight in named.items():
        value = np.asarray(arrays[name])
        if value.shape != torch_layout(weight):
            raise ValueError(f"{name}: torch's array is {value.shape}, the model's weight is "
                             f"{torch_layout(weight)} in torch's layout")
        weight.assign(value.T if weight.path.endswith("/kernel") else value)


def pretraining_loss(outputs: Any, targets: Any) -> Any:
    """Masked-LM cross-entropy plus next-sentence cross-entropy, in float32."""
    import tensorflow as tf

    mlm_logits, nsp_logits = outputs
    mlm_labels, nsp_labels = targets
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits
    return (tf.reduce_mean(ce(mlm_labels, tf.cast(mlm_logits, tf.float32)))
            + tf.reduce_mean(ce(nsp_labels, tf.cast(nsp_logits, tf.float32))))


def recipe(ctx: BuildContext) -> Parts:
    import tensorflow as tf

    batch, seq = ctx.batch_size, int(ctx.sizes["seq_length"])
    predictions = int(ctx.sizes["max_predictions_per_seq"])
    vocab = BERT_BASE.vocab_size
    model = bert_pretraining(BERT_BASE)
    input_ids = tf.random.uniform((batch, seq), 0, vocab, dtype=tf.int32)
    token_type_ids = tf.random.uniform((batch, seq), 0, BERT_BASE.type_vocab_size,
                                       dtype=tf.int32)
    attention_mask = tf.ones((batch, seq), dtype=tf.int32)
    # Distinct positions per sequence, in order, as BERT's data pipeline writes them.
    order = tf.argsort(tf.random.uniform((batch, seq)), axis=1)
    positions = tf.sort(order[:, :predictions], axis=1)

    def fresh_labels() -> Any:  # traced into the step: drawn on the device every step
        return (tf.random.uniform((batch, predictions), 0, vocab, dtype=tf.int32),
                tf.random.uniform((batch,), 0, 2, dtype=tf.int32))

    return Parts(model=model, inputs=(input_ids, token_type_ids, attention_mask, positions),
                 targets=fresh_labels, loss=pretraining_loss)
