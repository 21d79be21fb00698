"""A model whose memory grows with the batch in large steps, one recipe per framework but
torch's (tests/test_memory_cases.py has torch's), for tests/test_conformance_measured.py's
--dlperf-batch-size max cases. A module of its own, with no pytest in it: OneFlow's, MindSpore's,
MXNet's and JAX's ranks run under interpreters without pytest; each framework is imported inside
its recipe."""

# Each sample keeps ~30-50 MiB for backward (its 1024 features tiled 4096 times, then ReLU):
# memory grows with the batch in steps far larger than a process's own jitter.

from __future__ import annotations

from pytest_dlperf import Parts, Workload
from pytest_dlperf.core.workload import BuildContext


def tensorflow(ctx: BuildContext) -> Parts:
    import keras
    import tensorflow as tf

    inputs = keras.Input((1024,))
    h = keras.layers.Dense(1024)(inputs)
    h = keras.ops.tile(keras.ops.expand_dims(h, -1), [1, 1, 4096])
    outputs = keras.layers.Dense(10)(keras.ops.mean(keras.ops.relu(h), -1))
    return Parts(model=keras.Model(inputs, outputs),
                 inputs=tf.random.normal((ctx.batch_size, 1024)),
                 targets=lambda: tf.random.uniform((ctx.batch_size,), 0, 10, tf.int32))


def oneflow(ctx: BuildContext) -> Parts:
    import oneflow as flow

    class Wide(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = flow.nn.Linear(1024, 1024)
            self.head = flow.nn.Linear(1024, 10)

        def forward(self, x):
            h = self.proj(x).unsqueeze(-1).repeat(1, 1, 4096)
            return self.head(flow.relu(h).mean(-1))

    return Parts(model=Wide(), inputs=flow.randn(ctx.batch_size, 1024),
                 targets=lambda: flow.randint(0, 10, (ctx.batch_size,)))


def paddle(ctx: BuildContext) -> Parts:
    import paddle

    class Wide(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.proj = paddle.nn.Linear(1024, 1024)
            self.head = paddle.nn.Linear(1024, 10)

        def forward(self, x):
            h = self.proj(x).unsqueeze(-1).tile([1, 1, 4096])
            return self.head(paddle.nn.functional.relu(h).mean(-1))

    return Parts(model=Wide(), inputs=paddle.randn([ctx.batch_size, 1024]),
                 targets=lambda: paddle.randint(0, 10, [ctx.batch_size]))


def mindspore(ctx: BuildContext) -> Parts:
    import mindspore as ms

    class Wide(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.proj = ms.nn.Dense(1024, 1024)
            self.head = ms.nn.Dense(1024, 10)

        def construct(self, x):
            h = ms.ops.tile(self.proj(x).expand_dims(-1), (1, 1, 4096))
            return self.head(ms.ops.relu(h).mean(-1))

    return Parts(model=Wide(), inputs=ms.ops.randn(ctx.batch_size, 1024),
                 targets=lambda: ms.ops.randint(0, 10, (ctx.batch_size,), dtype=ms.int32))


def mxnet(ctx: BuildContext) -> Parts:
    import mxnet as mx

    class Wide(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.proj = mx.gluon.nn.Dense(1024, in_units=1024)
                self.head = mx.gluon.nn.Dense(10, in_units=1024)

        def hybrid_forward(self, F, x):
            h = F.tile(F.expand_dims(self.proj(x), -1), (1, 1, 4096))
            return self.head(F.relu(h).mean(-1))

    model = Wide()
    model.initialize(mx.init.Xavier())
    return Parts(model=model, inputs=mx.nd.random.normal(shape=(ctx.batch_size, 1024)),
                 targets=lambda: mx.nd.random.randint(0, 10, (ctx.batch_size,)))


def jax(ctx: BuildContext) -> Parts:
    # XLA would fuse a tile, its ReLU and the mean into one reduction that keeps nothing: a
    # convolution's output is kept for backward instead (16 MiB a sample at 256x256x64, and its
    # gradient as much). With 32 channels a launch's own jitter moved the edge by one (batch
    # 12 fitted as a probe, not when measured); with 64, three searches found 5 each.
    import jax
    from flax import nnx

    class Wide(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(3, 64, (3, 3), rngs=rngs)
            self.head = nnx.Linear(64, 10, rngs=rngs)

        def __call__(self, x):
            return self.head(nnx.relu(self.conv(x)).mean((1, 2)))

    keys = iter(jax.random.split(jax.random.key(ctx.seed), 100_000))
    return Parts(model=Wide(nnx.Rngs(ctx.seed)),
                 inputs=jax.random.normal(next(keys), (ctx.batch_size, 256, 256, 3)),
                 targets=lambda: jax.random.randint(next(keys), (ctx.batch_size,), 0, 10))


WIDE = Workload("wide", recipes={name: f"wide_recipes:{name}" for name in (
    "tensorflow", "oneflow", "paddle", "mindspore", "mxnet", "jax")}, batch_size={"cpu": 8})
