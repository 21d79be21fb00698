"""ResNet-50 v1.5 in JAX: torchvision's ``resnet50`` written as a Flax NNX module.

Why written here: neither JAX nor Flax ships one. Flax's ImageNet example
(``examples/imagenet/models.py``) is a linen script under names of its own, with each block's
last BatchNorm scale zero-initialized and Flax's ``"SAME"`` padding, and a zoo package would be
a dependency for ~60 lines of network. Written in torchvision's module order and under its
attribute names, it is one definition checked against torchvision layer for layer, as MXNet's
(``mxnet``), MindSpore's (``resnet50.mindspore``) and Keras'
(``resnet50.tensorflow.resnet50_v15``) are.

What it matches:

- convolutions zero-padded symmetrically (``kernel // 2``, as torchvision; ``"SAME"`` pads a
  strided convolution more on the right and bottom) and without bias; the stride of a stage's
  first block on its 3x3 convolution (v1.5); the max pool padded by one with -inf
  (``nnx.max_pool`` pads with its reduction's identity);
- torchvision's initialization: convolutions normal with std sqrt(2 / (out x k x k)), He over
  fan-out (JAX's ``he_normal`` is truncated and over fan-in), BatchNorm scales one and shifts
  zero (``zero_init_residual`` is off in torchvision), the classifier uniform in
  +-1/sqrt(2048), weight and bias, as torch's ``Linear``. The initial values are drawn by
  numpy on the host from the seed and placed on the default device, as torch draws them on the
  CPU: JAX would compile a program per shape drawn, ~20 here, 14 s to build the model on a
  2-core machine where this takes 1 s;
- BatchNorm epsilon 1e-5 and momentum 0.9: Flax keeps ``momentum`` x the old statistics, so
  its 0.9 is torch's 0.1 (Flax's default, 0.99, would be torch's 0.01).

What it does not match, Flax's BatchNorm (``flax/nnx/nn/normalization.py``): the running
variance moves with the batch's biased variance (``_compute_stats``: ``E[x^2] - E[x]^2`` over
the batch, in one pass, ``use_fast_variance`` on by default), where torch's takes the unbiased
one; with 8 values a channel (layer4 at 64x64, batch 2) they are 0.1 x 1/7 of the batch's
variance apart. A training step normalizes with the batch's biased variance in both, so the
step, and its time, are the same; only the running variance an evaluation would use differs.

Training and evaluation: a BatchNorm's mode is its ``use_running_average`` attribute, which
``model.train()`` sets to False throughout and ``model.eval()`` to True. It is a plain Python
attribute, so it is part of ``nnx.split``'s graph definition, not of the state: switching
changes the graph definition, and a jitted step compiled in one mode is traced again in the
other. ``resnet50()`` returns the model in training mode. A forward in it writes the new
running statistics into the ``nnx.BatchStat`` variables; a step traced over
``nnx.split``/``nnx.merge`` must hand that state back out, as it does the parameters.

Precision: ``dtype`` is the compute dtype (AMP: "bfloat16"); parameters and running statistics
stay float32 (``param_dtype``), and BatchNorm computes its batch statistics in float32 whatever
the compute dtype. The logits come out in the compute dtype.

Names: a parameter's path is its attribute path, torchvision's (``layer1.0.downsample.0``), but
Flax calls a convolution's and a Linear's weight ``kernel`` and lays it out HWIO and (in, out)
where torch has OIHW and (out, in), and a BatchNorm's are ``scale``, ``bias``, ``mean`` and
``var`` where torch's are ``weight``, ``bias``, ``running_mean`` and ``running_var``.
``nnx.state`` lists them sorted by path, not in the model's order, so ``torch_variables`` walks
the model in torchvision's order.

JAX and Flax are imported inside functions only: the pytest side imports this module and has
neither.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ...core.workload import BuildContext, Parts
from .. import _jax_torch
from . import NUM_CLASSES

BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9  # Flax's convention: torch's momentum 0.1
STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))  # (width, blocks) of layer1..layer4
# (torch's leaf, Flax's attribute, the axes of Flax's array in torch's layout: None = as is)


def resnet50(num_classes: int = NUM_CLASSES, *, seed: int = 0, dtype: str = "float32") -> Any:
    """torchvision's ResNet-50 (v1.5, NHWC) as a Flax NNX module, initialized as torchvision's
    from ``seed``, computing in ``dtype`` with float32 parameters, in training mode."""
    import jax.numpy as jnp

    model = _classes().ResNet50(num_classes, jnp.dtype(dtype), seed)
    model.train()
    return model


def recipe(ctx: BuildContext) -> Parts:
    """Random NHWC images on the default device, fresh random labels every step; the loss is
    the adapter's default cross-entropy (logits [B, 1000] against int labels [B])."""
    import jax
    import jax.numpy as jnp

    model = resnet50(NUM_CLASSES, seed=ctx.seed, dtype=ctx.amp_dtype)
    size = int(ctx.sizes["image_size"])
    # The model's seed is every rank's (one model); the data's is folded with the rank, so
    # that each rank has a batch of its own, as data parallelism's ranks do.
    images_key, labels_key = jax.random.split(jax.random.fold_in(jax.random.key(ctx.seed),
                                                                 ctx.rank))
    images = jax.random.normal(images_key, (ctx.batch_size, size, size, 3), jnp.float32)
    keys = [labels_key]

    def fresh_labels() -> Any:
        # JAX's random numbers are a function of a key: a new key each call for new labels.
        # Called outside the traced step (a key kept here, split inside a trace, would leak
        # a tracer); drawn asynchronously on the device.
        keys[0], key = jax.random.split(keys[0])
        return jax.random.randint(key, (ctx.batch_size,), 0, NUM_CLASSES, jnp.int32)

    return Parts(model=model, inputs=images, targets=fresh_labels)


def named_parameters(model: Any) -> dict[str, Any]:
    """Every parameter and BatchNorm running statistic under torchvision's ``state_dict``
    name, in torchvision's order, as a JAX array in torch's layout."""
    return _jax_torch.named_arrays(torch_variables(model))


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The trainable parameters under torchvision's names, in torch's order and layout: what
    the alignment test compares with torchvision's ``named_parameters()``."""
    return _jax_torch.named_shapes(torch_variables(model))


def load_torch_weights(model: Any, arrays: Mapping[str, Any]) -> None:
    """Set every parameter and BatchNorm running statistic from torchvision's ``state_dict()``
    arrays by name (``num_batches_tracked`` left out), converted to Flax's layout. Refuses a
    missing or extra name and a shape that differs, before setting anything."""
    _jax_torch.load(torch_variables(model), arrays)


def torch_variables(model: Any) -> _jax_torch.Walk:
    """torchvision's ``state_dict`` name -> (the Flax variable, the axes that put it in torch's
    layout), in torchvision's order: each layer's own, in the order torch registers them."""
    return _jax_torch.walk(layers(model))


def layers(model: Any) -> Iterator[tuple[str, Any]]:
    """(torchvision's module path, the layer) for every layer with parameters, in
    torchvision's order."""
    yield "conv1", model.conv1
    yield "bn1", model.bn1
    for stage in range(1, len(STAGES) + 1):
        for index, block in enumerate(getattr(model, f"layer{stage}")):
            prefix = f"layer{stage}.{index}"
            for name in ("conv1", "bn1", "conv2", "bn2", "conv3", "bn3"):
                yield f"{prefix}.{name}", getattr(block, name)
            for position, layer in enumerate(block.downsample or ()):
                yield f"{prefix}.downsample.{position}", layer
    yield "fc", model.fc


@functools.cache
def _classes() -> SimpleNamespace:
    """The network's classes, defined on first use (they derive from ``nnx.Module``)."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    Module: Any = nnx.Module

    class Bottleneck(Module):  # type: ignore[misc]
        def __init__(self, width: int, planes: int, stride: int, made: Made) -> None:
            self.conv1 = conv(width, planes, 1, 1, made)
            self.bn1 = bn(planes, made)
            self.conv2 = conv(planes, planes, 3, stride, made)  # v1.5: the stride is here
            self.bn2 = bn(planes, made)
            self.conv3 = conv(planes, planes * 4, 1, 1, made)
            self.bn3 = bn(planes * 4, made)
            # Data even where None: Flax 0.12 fixes an attribute's kind (static or data) at
            # its first assignment, and a plain None is static.
            self.downsample = nnx.data(None)
            if stride != 1 or width != planes * 4:
                self.downsample = nnx.List([conv(width, planes * 4, 1, stride, made),
                                            bn(planes * 4, made)])

        def __call__(self, x: Any) -> Any:
            out = nnx.relu(self.bn1(self.conv1(x)))
            out = nnx.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            identity = x
            if self.downsample is not None:
                identity = self.downsample[1](self.downsample[0](x))
            return nnx.relu(out + identity)

    class ResNet50(Module):  # type: ignore[misc]
        def __init__(self, num_classes: int, dtype: Any, seed: int) -> None:
            made = Made(dtype, np.random.default_rng(seed), nnx.Rngs(seed))
            self.conv1 = conv(3, 64, 7, 2, made)
            self.bn1 = bn(64, made)
            width = 64
            for index, (planes, blocks) in enumerate(STAGES, start=1):
                # nnx.List, not a Python list: Flax 0.12 refuses modules in a plain list
                # attribute (it would be static, part of the graph definition).
                stage = nnx.List([Bottleneck(width, planes, 1 if index == 1 else 2, made)])
                stage.extend(Bottleneck(planes * 4, planes, 1, made) for _ in range(blocks - 1))
                setattr(self, f"layer{index}", stage)
                width = planes * 4
            bound = 1 / math.sqrt(width)  # torch's Linear: kaiming_uniform(a=sqrt(5)) = this
            self.fc = nnx.Linear(width, num_classes, dtype=dtype, param_dtype=jnp.float32,
                                 kernel_init=uniform(made.host, bound),
                                 bias_init=uniform(made.host, bound), rngs=made.rngs)

        def __call__(self, x: Any) -> Any:
            x = nnx.relu(self.bn1(self.conv1(x)))
            x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
            for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
                for block in stage:
                    x = block(x)
            return self.fc(jnp.mean(x, axis=(1, 2)))

    return SimpleNamespace(ResNet50=ResNet50)


@dataclass(frozen=True)
class Made:
    """What every layer of one model is made with: the compute dtype, the host's random
    generator its initial values are drawn from, and the ``nnx.Rngs`` Flax's layers take (and
    draw keys from, which the initializers here leave unused)."""

    dtype: Any
    host: Any
    rngs: Any


def conv(width: int, out: int, kernel: int, stride: int, made: Made) -> Any:
    """torchvision's convolution: no bias, zero-padded ``kernel // 2`` on every side."""
    import jax.numpy as jnp
    from flax import nnx

    pad = kernel // 2
    return nnx.Conv(width, out, (kernel, kernel), (stride, stride),
                    padding=((pad, pad), (pad, pad)), use_bias=False, dtype=made.dtype,
                    param_dtype=jnp.float32, kernel_init=he_out(made.host), rngs=made.rngs)


def bn(width: int, made: Made) -> Any:
    """torch's BatchNorm2d defaults, in Flax's convention."""
    import jax.numpy as jnp
    from flax import nnx

    return nnx.BatchNorm(width, momentum=BN_MOMENTUM, epsilon=BN_EPSILON, dtype=made.dtype,
                         param_dtype=jnp.float32, rngs=made.rngs)


# Initial values drawn by numpy from the model's seed (the module's docstring says why): the
# key Flax's layers pass is left unused.
def he_out(host: Any) -> Any:
    """torchvision's convolution initializer: normal, std sqrt(2 / fan-out), for HWIO."""
    import jax.numpy as jnp
    import numpy as np

    def init(key: Any, shape: Any, dtype: Any = jnp.float32) -> Any:
        std = math.sqrt(2 / math.prod(shape[:-2] + shape[-1:]))  # k x k x out
        return jnp.asarray(host.standard_normal(shape, np.float32) * np.float32(std), dtype)
    return init


def uniform(host: Any, bound: float) -> Any:
    """torch's ``Linear`` initializer, weight and bias: uniform in +-``bound``."""
    import jax.numpy as jnp
    import numpy as np

    def init(key: Any, shape: Any, dtype: Any = jnp.float32) -> Any:
        return jnp.asarray(host.uniform(-bound, bound, shape).astype(np.float32), dtype)
    return init
