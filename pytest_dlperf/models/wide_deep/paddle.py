"""Wide & Deep in PaddlePaddle: the Paddle recipe of ``wide_deep``, the model of
``torch.build`` layer for layer and under its parameter names (``deep_embedding``,
``tower.0``, ``tower.3``, ``deep_scores``: each sublayer an attribute named as torch's module),
so that a test loads torch's weights into it by name and compares the logits and the loss.

Paddle's ``Linear`` keeps its weight as [in, out], torch's as [out, in]: the model keeps
Paddle's layout, and ``load_torch_weights`` transposes. Xavier-uniform has the same bound
either way (it depends on fan-in plus fan-out). The tables are ``Embedding`` with a dense
gradient (``sparse=False``), as torch's; ``Adam`` then updates every row, as torch's does.

The ids are drawn every step by Paddle ops (the power law of
``torch.power_law_ids``), from Paddle's global generator, which the adapter seeds per
replica after the recipe has built the model from the case's seed.

Paddle is imported inside functions only: the pytest side imports this module.
"""

from __future__ import annotations

import functools
from typing import Any

from ...core.workload import BuildContext, Parts

# torch's names and layout, as BERT's port loads them (Linear weights transposed)
from ..bert.paddle import load_torch_weights as load_torch_weights
from ..bert.paddle import torch_named_shapes as torch_named_shapes
from . import SCATTER, WideDeepShape


def build(shape: WideDeepShape) -> Any:
    """``model(dense, wide_ids, deep_ids)`` -> one logit a sample [B]."""
    return _classes().WideDeep(shape)


@functools.cache
def _classes() -> Any:
    """The model's class, defined once, on first use (it derives from ``paddle.nn.Layer``)."""
    from types import SimpleNamespace

    import paddle

    Layer: Any = paddle.nn.Layer

    def table(rows: int, width: int) -> Any:
        return paddle.nn.Embedding(rows, width, weight_attr=paddle.ParamAttr(
            initializer=paddle.nn.initializer.Uniform(-0.05, 0.05)))

    def linear(width: int, out: int) -> Any:
        return paddle.nn.Linear(width, out, bias_attr=paddle.ParamAttr(
            initializer=paddle.nn.initializer.Constant(0.0)), weight_attr=paddle.ParamAttr(
            initializer=paddle.nn.initializer.XavierUniform()))

    class WideDeep(Layer):  # type: ignore[misc]
        def __init__(self, shape: WideDeepShape) -> None:
            super().__init__()
            self.wide_embedding = table(shape.vocab, 1)
            self.deep_embedding = table(shape.vocab, shape.deep_width)
            layers: list[Any] = []
            width = shape.tower_input
            for _ in range(shape.hidden_layers):
                layers += [linear(width, shape.hidden_size), paddle.nn.ReLU(),
                           paddle.nn.Dropout(shape.dropout)]
                width = shape.hidden_size
            self.tower = paddle.nn.Sequential(*layers)
            self.deep_scores = linear(width, 1)

        def forward(self, dense: Any, wide_ids: Any, deep_ids: Any) -> Any:
            wide = self.wide_embedding(wide_ids).sum(axis=[1, 2])
            # 0 in a reshape keeps that dimension: no shape read under to_static.
            deep = paddle.concat([self.deep_embedding(deep_ids).reshape([0, -1]),
                                  dense.astype(self.deep_embedding.weight.dtype)], axis=1)
            return wide + self.deep_scores(self.tower(deep)).squeeze(-1)

    return SimpleNamespace(WideDeep=WideDeep)


def power_law_ids(shape: WideDeepShape, batch: int, slots: int, first_slot: int) -> Any:
    """``torch.power_law_ids`` in Paddle ops: ``batch`` x ``slots`` int64 ids in
    [0, vocab), slot ``s``'s hot rows at (s * (vocab // slots in all))."""
    import paddle

    vocab, s = shape.vocab, shape.zipf
    u = paddle.rand([batch, slots], dtype="float64")
    if abs(s - 1.0) < 1e-9:
        x = paddle.pow(paddle.full([1], float(vocab), "float64"), u)
    else:
        top = float(vocab) ** (1.0 - s)
        x = paddle.pow(1.0 + u * (top - 1.0), 1.0 / (1.0 - s))
    rank = paddle.clip(paddle.floor(x), 1, vocab).astype("int64") - 1
    every = shape.deep_slots + shape.wide_slots
    offsets = paddle.arange(first_slot, first_slot + slots, dtype="int64") * (vocab // every)
    return paddle.remainder(rank * SCATTER + offsets, paddle.full([1], vocab, "int64"))


def click_loss(logits: Any, clicks: Any) -> Any:
    """Sigmoid cross-entropy of the logits against 0/1 clicks, the mean, in float32."""
    import paddle.nn.functional as F

    return F.binary_cross_entropy_with_logits(logits.astype("float32"), clicks)


def recipe(ctx: BuildContext) -> Parts:
    """No device arguments: the adapter has called ``paddle.set_device`` for this rank."""
    import paddle

    shape = WideDeepShape.of(ctx.sizes)
    batch = ctx.batch_size
    model = build(shape)  # from the case's seed, which the adapter set: the same on every rank
    dense = paddle.rand([batch, shape.dense_fields])  # drawn once, as torch's recipe does

    def fresh_ids() -> Any:  # the rows a step touches move as a click log's do
        return (dense, power_law_ids(shape, batch, shape.wide_slots, shape.deep_slots),
                power_law_ids(shape, batch, shape.deep_slots, 0))

    def fresh_labels() -> Any:
        return (paddle.rand([batch]) < 0.5).astype("float32")

    return Parts(model=model, inputs=fresh_ids, targets=fresh_labels, loss=click_loss)
