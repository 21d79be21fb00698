"""A user's own model, one recipe per framework: an MLP (width -> 2 width -> 10 classes) on
random rows, for tests/test_conformance.py's cases on two nodes. A module of its own, with no
pytest in it: the ranks of MindSpore, MXNet and JAX run under interpreters without pytest, so
the recipe cannot live in the test file; each framework is imported inside its recipe."""

from __future__ import annotations

from typing import Any

from pytest_dlperf import Parts
from pytest_dlperf.core.workload import BuildContext


def paddle(ctx: BuildContext) -> Parts:
    import paddle

    width = int(ctx.sizes["width"])
    model = paddle.nn.Sequential(paddle.nn.Linear(width, 2 * width), paddle.nn.ReLU(),
                                 paddle.nn.Linear(2 * width, 10))
    return Parts(model=model, inputs=paddle.randn([ctx.batch_size, width]),
                 targets=lambda: paddle.randint(0, 10, [ctx.batch_size]))


def mindspore(ctx: BuildContext) -> Parts:
    import mindspore as ms
    import numpy as np

    width = int(ctx.sizes["width"])
    model = ms.nn.SequentialCell(ms.nn.Dense(width, 2 * width), ms.nn.ReLU(),
                                 ms.nn.Dense(2 * width, 10))
    rng = np.random.default_rng(ctx.rank)
    return Parts(model=model,
                 inputs=ms.Tensor(rng.standard_normal((ctx.batch_size, width), np.float32)),
                 targets=ms.Tensor(rng.integers(0, 10, ctx.batch_size).astype(np.int32)))


def mxnet(ctx: BuildContext) -> Parts:
    import mxnet as mx

    width = int(ctx.sizes["width"])
    model = mx.gluon.nn.HybridSequential()
    model.add(mx.gluon.nn.Dense(2 * width, in_units=width, activation="relu"),
              mx.gluon.nn.Dense(10, in_units=2 * width))
    model.initialize(mx.init.Xavier())
    return Parts(model=model, inputs=mx.nd.random.normal(shape=(ctx.batch_size, width)),
                 targets=lambda: mx.nd.random.randint(0, 10, (ctx.batch_size,)))


def jax(ctx: BuildContext) -> Parts:
    import jax
    from flax import nnx

    width = int(ctx.sizes["width"])
    rngs = nnx.Rngs(ctx.seed)
    model = nnx.Sequential(nnx.Linear(width, 2 * width, dtype=ctx.amp_dtype, rngs=rngs),
                           nnx.relu,
                           nnx.Linear(2 * width, 10, dtype=ctx.amp_dtype, rngs=rngs))
    keys: Any = iter(jax.random.split(jax.random.key(ctx.seed + ctx.rank), 100_000))
    inputs = jax.random.normal(next(keys), (ctx.batch_size, width))
    return Parts(model=model, inputs=inputs,
                 targets=lambda: jax.random.randint(next(keys), (ctx.batch_size,), 0, 10))
