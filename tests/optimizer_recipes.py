"""Tiny linear recipes for checking what each adapter's optimizer does to the weights (imported
by ranks and snippets by module path: ``optimizer_recipes:<framework>``)."""

from __future__ import annotations

from typing import Any

from pytest_dlperf.core.workload import BuildContext, Parts

IN, OUT, BATCH = 8, 4, 4
# "big": gradients far above any clip bound; "zero": a loss with no gradient (only decay acts).
LOSS = {"big": 1000.0, "zero": 0.0}


def torch(ctx: BuildContext) -> Parts:
    import torch

    model = torch.nn.Linear(IN, OUT)
    factor = LOSS[str(ctx.sizes["loss"])]
    return Parts(model=model, inputs=torch.ones(BATCH, IN), targets=torch.zeros(BATCH),
                 loss=lambda out, _: factor * out.sum())


def oneflow(ctx: BuildContext) -> Parts:
    import oneflow as flow

    model = flow.nn.Linear(IN, OUT)
    factor = LOSS[str(ctx.sizes["loss"])]

    class Loss(flow.nn.Module):  # type: ignore[misc]
        def forward(self, out: Any, _: Any) -> Any:
            return (out * factor).sum()

    return Parts(model=model, inputs=flow.ones(BATCH, IN), targets=flow.zeros(BATCH),
                 loss=Loss())


def tensorflow(ctx: BuildContext) -> Parts:
    import keras
    import tensorflow as tf

    inputs = keras.Input((IN,))
    model = keras.Model(inputs, keras.layers.Dense(OUT, bias_initializer="ones")(inputs))
    factor = LOSS[str(ctx.sizes["loss"])]
    return Parts(model=model, inputs=tf.ones((BATCH, IN)), targets=tf.zeros((BATCH,)),
                 loss=lambda out, _: factor * tf.reduce_sum(out))


def tensorflow_random(ctx: BuildContext) -> Parts:
    """``paddle_random`` in TensorFlow. The data are constants the step reads: a tf.Variable
    made under the strategy's scope would start as worker 0's value on every worker."""
    import keras
    import numpy as np
    import tensorflow as tf

    data = np.random.RandomState(100 + int(ctx.sizes["data_rank"]))
    inputs = data.randn(BATCH, IN).astype("float32")
    targets = data.randn(BATCH, OUT).astype("float32")
    layer = keras.Input((IN,))

    def constant(array: Any) -> Any:  # a function, not a lambda: autograph reads its source
        def read() -> Any:
            return tf.constant(array)
        return read

    return Parts(model=keras.Model(layer, keras.layers.Dense(OUT)(layer)),
                 inputs=constant(inputs), targets=constant(targets),
                 loss=lambda out, target: tf.reduce_mean((out - target) ** 2))


def paddle(ctx: BuildContext) -> Parts:
    import paddle

    model = paddle.nn.Linear(IN, OUT, bias_attr=paddle.ParamAttr(
        initializer=paddle.nn.initializer.Constant(1.0)))
    factor = LOSS[str(ctx.sizes["loss"])]
    return Parts(model=model, inputs=paddle.ones([BATCH, IN]), targets=paddle.zeros([BATCH]),
                 loss=lambda out, _: factor * out.sum())


def paddle_random(ctx: BuildContext) -> Parts:
    """A linear layer on random data of its own per ``data_rank`` (a size), so that one rank
    alone can train on the data of either rank of a pair."""
    import paddle

    model = paddle.nn.Linear(IN, OUT)
    paddle.seed(100 + int(ctx.sizes["data_rank"]))
    return Parts(model=model, inputs=paddle.randn([BATCH, IN]), targets=paddle.randn([BATCH, OUT]),
                 loss=lambda out, target: ((out - target) ** 2).mean())


def paddle_loader(ctx: BuildContext) -> Parts:
    """A linear layer fed by a ``paddle.io.DataLoader`` of 3 batches (an input pipeline)."""
    import paddle

    dataset = paddle.io.TensorDataset([paddle.randn([3 * BATCH, IN]),
                                       paddle.randint(0, OUT, [3 * BATCH])])
    return Parts(model=paddle.nn.Linear(IN, OUT),
                 data=paddle.io.DataLoader(dataset, batch_size=BATCH, shuffle=True))


def mindspore(ctx: BuildContext) -> Parts:
    import mindspore as ms

    model = ms.nn.Dense(IN, OUT)
    factor = LOSS[str(ctx.sizes["loss"])]

    class Loss(ms.nn.Cell):  # type: ignore[misc]
        def construct(self, out: Any, _: Any) -> Any:  # GRAPH mode: a Cell, not a lambda
            return (out * factor).sum()

    return Parts(model=model, inputs=ms.ops.ones((BATCH, IN), ms.float32),
                 targets=ms.ops.zeros((BATCH,), ms.float32), loss=Loss())


def mindspore_random(ctx: BuildContext) -> Parts:
    """``paddle_random`` in MindSpore: random data of its own per ``data_rank``."""
    import mindspore as ms
    import numpy as np

    model = ms.nn.Dense(IN, OUT)
    rng = np.random.default_rng(100 + int(ctx.sizes["data_rank"]))

    class Loss(ms.nn.Cell):  # type: ignore[misc]
        def construct(self, out: Any, target: Any) -> Any:
            return ((out - target) ** 2).mean()

    return Parts(model=model, inputs=ms.Tensor(rng.standard_normal((BATCH, IN), np.float32)),
                 targets=ms.Tensor(rng.standard_normal((BATCH, OUT), np.float32)), loss=Loss())


def mxnet(ctx: BuildContext) -> Parts:
    import mxnet as mx

    # A bias of its own values: a zero bias (Gluon's default) stays zero under any decay.
    model = mx.gluon.nn.Dense(OUT, in_units=IN, bias_initializer=mx.init.Uniform(0.5))
    model.initialize(mx.init.Uniform(0.5))
    factor = LOSS[str(ctx.sizes["loss"])]
    return Parts(model=model, inputs=mx.nd.ones((BATCH, IN)), targets=mx.nd.zeros((BATCH,)),
                 loss=lambda out, _: (out * factor).sum())


def mxnet_random(ctx: BuildContext) -> Parts:
    """``paddle_random`` in MXNet: random data of its own per ``data_rank``."""
    import mxnet as mx
    import numpy as np

    model = mx.gluon.nn.Dense(OUT, in_units=IN, bias_initializer=mx.init.Uniform(0.5))
    model.initialize(mx.init.Uniform(0.5))
    rng = np.random.default_rng(100 + int(ctx.sizes["data_rank"]))
    return Parts(model=model, inputs=mx.nd.array(rng.standard_normal((BATCH, IN))),
                 targets=mx.nd.array(rng.standard_normal((BATCH, OUT))),
                 loss=lambda out, target: ((out - target) ** 2).mean())


def jax(ctx: BuildContext) -> Parts:
    import jax.numpy as jnp
    from flax import nnx
    from jax.nn import initializers

    model = nnx.Linear(IN, OUT, bias_init=initializers.uniform(0.5), rngs=nnx.Rngs(ctx.seed))
    factor = LOSS[str(ctx.sizes["loss"])]
    return Parts(model=model, inputs=jnp.ones((BATCH, IN)), targets=jnp.zeros((BATCH,)),
                 loss=lambda out, _: factor * out.sum())


def jax_random(ctx: BuildContext) -> Parts:
    """``paddle_random`` in JAX: random data of its own per ``data_rank``, the same model on
    every rank (seeded by the case)."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.nn import initializers

    model = nnx.Linear(IN, OUT, kernel_init=initializers.uniform(0.5),
                       bias_init=initializers.uniform(0.5), rngs=nnx.Rngs(ctx.seed))
    rng = np.random.default_rng(100 + int(ctx.sizes["data_rank"]))
    return Parts(model=model, inputs=jnp.asarray(rng.standard_normal((BATCH, IN)), jnp.float32),
                 targets=jnp.asarray(rng.standard_normal((BATCH, OUT)), jnp.float32),
                 loss=lambda out, target: ((out - target) ** 2).mean())
