"""Wide & Deep in Keras 3 (TensorFlow backend): the TensorFlow recipe of ``wide_deep``, the model
of ``torch.build`` layer for layer.

Each layer is named by torch's module path (``deep_embedding``, ``tower.0``, ``tower.3``,
``deep_scores``), so that a weight's Keras path ``<torch module>/<kind>`` is its torch parameter
name, a ``kernel`` transposed to torch's (out, in): a test loads torch's weights through that
rename and checks the logits and the loss. The initializers are torch's distributions (tables
uniform in (-0.05, 0.05), Xavier-uniform kernels, zero biases), each seeded from the case's
seed, so every rank builds the same weights whatever its own seed.

The ids are drawn inside the compiled step (the adapter calls ``Parts.inputs`` there), so they
are TensorFlow ops: the power law of ``torch.power_law_ids``, in float64 then int64,
from TensorFlow's stateful random ops (seeded by the runtime's global seed, the case's seed
plus the rank). The tables' gradients are ``IndexedSlices`` (TensorFlow's
gather), which Keras' Adam takes as they are; torch's ``nn.Embedding`` gives a dense one.

Frameworks are imported inside functions only: this module is imported on the pytest side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...core.workload import BuildContext, Parts
from ..bert.tensorflow import assign_torch_arrays, torch_layout
from . import SCATTER, WideDeepShape

# Keras variable kind -> torch parameter suffix; a kernel is also transposed.
_KINDS = {"kernel": "weight", "embeddings": "weight", "bias": "bias"}


def build(shape: WideDeepShape, seed: int = 0) -> Any:
    """``model((dense, wide_ids, deep_ids))`` -> one float32 logit a sample: dense [B, 13]
    float32, wide_ids [B, wide_slots] and deep_ids [B, deep_slots] int64."""
    import keras
    from keras import layers

    seeds = iter(range(seed * 1_000, seed * 1_000 + 1_000))  # one per initializer: see below

    def table(width: int, name: str) -> Any:
        # A seeded Keras initializer draws the same values at every call: a fresh one per
        # variable, so the two tables (and the kernels) differ.
        return layers.Embedding(shape.vocab, width, name=name,
                                embeddings_initializer=keras.initializers.RandomUniform(
                                    -0.05, 0.05, seed=next(seeds)))

    def linear(units: int, name: str, activation: str | None = None) -> Any:
        return layers.Dense(units, activation=activation, name=name, bias_initializer="zeros",
                            kernel_initializer=keras.initializers.GlorotUniform(next(seeds)))

    dense = keras.Input((shape.dense_fields,), dtype="float32", name="dense")
    wide_ids = keras.Input((shape.wide_slots,), dtype="int64", name="wide_ids")
    deep_ids = keras.Input((shape.deep_slots,), dtype="int64", name="deep_ids")
    wide = keras.ops.sum(table(1, "wide_embedding")(wide_ids), axis=(1, 2))
    deep = layers.Reshape((shape.deep_slots * shape.deep_width,), name="flatten")(
        table(shape.deep_width, "deep_embedding")(deep_ids))
    # Concatenate casts the dense features to the compute dtype (bfloat16 under AMP).
    x = layers.Concatenate(name="concat")([deep, dense])
    for index in range(shape.hidden_layers):  # torch's Sequential: Linear, ReLU, Dropout
        x = linear(shape.hidden_size, f"tower.{3 * index}", "relu")(x)
        x = layers.Dropout(shape.dropout, name=f"tower.{3 * index + 2}")(x)
    deep_logit = keras.ops.squeeze(linear(1, "deep_scores")(x), axis=-1)
    # A float32 layer casts its input: the logit leaves the model in float32 under any policy.
    logit = layers.Activation("linear", dtype="float32", name="logit")(wide + deep_logit)
    return keras.Model((dense, wide_ids, deep_ids), logit, name="wide_deep")


def power_law_ids(shape: WideDeepShape, batch: int, slots: int, first_slot: int) -> Any:
    """``torch.power_law_ids`` in TensorFlow ops (traced into the step): ``batch`` x
    ``slots`` int64 ids in [0, vocab), slot ``s``'s hot rows at (s * (vocab // slots in all))."""
    import tensorflow as tf

    vocab, s = shape.vocab, shape.zipf
    u = tf.random.uniform((batch, slots), dtype=tf.float64)
    if abs(s - 1.0) < 1e-9:
        x = tf.pow(tf.constant(float(vocab), tf.float64), u)
    else:
        top = float(vocab) ** (1.0 - s)
        x = tf.pow(1.0 + u * (top - 1.0), 1.0 / (1.0 - s))
    rank = tf.clip_by_value(tf.cast(tf.floor(x), tf.int64), 1, vocab) - 1
    every = shape.deep_slots + shape.wide_slots
    offsets = tf.range(first_slot, first_slot + slots, dtype=tf.int64) * (vocab // every)
    return tf.math.floormod(rank * SCATTER + offsets, vocab)


def click_loss(logits: Any, clicks: Any) -> Any:
    """Sigmoid cross-entropy of the logits against 0/1 clicks, the mean, in float32."""
    import tensorflow as tf

    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(clicks, tf.float32), logits=tf.cast(logits, tf.float32)))


def _torch_named_weights(model: Any) -> dict[str, Any]:
    named = {}
    for weight in model.trainable_weights:
        module, _, kind = weight.path.rpartition("/")
        named[f"{module}.{_KINDS[kind]}"] = weight
    return named


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The trainable weights under ``torch.build``'s parameter names, torch's layout."""
    return {name: torch_layout(w) for name, w in _torch_named_weights(model).items()}


def load_torch_weights(model: Any, arrays: Mapping[str, Any]) -> None:
    """Set every trainable weight from torch's parameters by name (torch layout), refusing a
    name either side lacks or a shape that differs (``bert.tensorflow.assign_torch_arrays``)."""
    assign_torch_arrays(_torch_named_weights(model), arrays)


def recipe(ctx: BuildContext) -> Parts:
    import tensorflow as tf

    shape = WideDeepShape.of(ctx.sizes)
    batch = ctx.batch_size
    model = build(shape, ctx.seed)
    # The dense features drawn once (torch's recipe keeps them too), the ids every step.
    dense = tf.random.uniform((batch, shape.dense_fields))

    def fresh_ids() -> Any:  # traced into the step: drawn on the device every step
        return (dense, power_law_ids(shape, batch, shape.wide_slots, shape.deep_slots),
                power_law_ids(shape, batch, shape.deep_slots, 0))

    def fresh_labels() -> Any:
        return tf.cast(tf.random.uniform((batch,)) < 0.5, tf.float32)

    inputs: Callable[[], Any] = fresh_ids
    return Parts(model=model, inputs=inputs, targets=fresh_labels, loss=click_loss)
