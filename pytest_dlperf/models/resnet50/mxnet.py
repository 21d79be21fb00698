"""ResNet-50 v1.5 in MXNet: torchvision's ``resnet50`` written from ``mxnet.gluon.nn``.

Why not a zoo's: MXNet's own ``gluon.model_zoo.vision.resnet50_v1`` is v1 (the stride of a
stage's first block on its first 1x1 convolution) and has biases on its blocks' 1x1
convolutions: 25,575,912 parameters, 18,880 more than torchvision's. gluoncv's
``resnet50_v1b`` is v1.5, but ``gluoncv==0.10.5`` requires opencv-python, matplotlib, scipy,
pandas and more, unpinned, whose current releases want numpy 2, in an interpreter that MXNet
1.9.1 needs on numpy < 1.24: each would have to be pinned, for ~60 lines of network under
names of its own. Written here, in torchvision's module order and under its attribute names,
it is one definition checked against torchvision layer for layer, as MindSpore's
(``resnet50.mindspore``) and Keras' (``resnet50.tensorflow.resnet50_v15``) are.

What it matches:

- convolutions zero-padded symmetrically (``kernel // 2``, as torchvision) and without bias;
  the stride of a stage's first block on its 3x3 convolution (v1.5); the max pool padded by one;
- torchvision's initialization: convolutions He-normal over fan-out (``MSRAPrelu("out", 0)``:
  std sqrt(2 / (out x k x k))), BatchNorm scales one and shifts zero (the last BatchNorm of a
  block not zeroed: torchvision's ``zero_init_residual`` is off), the classifier uniform in
  +-1/sqrt(2048), weight and bias, as torch's ``Linear``;
- BatchNorm epsilon 1e-5 and momentum 0.9: MXNet keeps ``momentum`` x the old statistics, so
  its 0.9 is torch's 0.1.

What it cannot match, MXNet's BatchNorm (measured on CPU, oneDNN on and off): the running
statistics move in the backward pass, not in the forward (a forward under ``autograd.record``
alone leaves them), and the running variance with the batch's biased variance where torch's
takes the unbiased one (with 8 values a channel, layer4's at 64x64 and batch 2, 1/7 of the
batch's variance x 0.1 apart). A training step normalizes with the batch's statistics in both,
so the step, and its time, are the same. Hybridized with ``static_shape``, that backward writes
them behind the engine's back: ``running_mean.data().asnumpy()`` right after it can read the
old values; ``mx.nd.waitall()`` first. And a backward recorded in inference mode
(``record(train_mode=False)``) differentiates BatchNorm as if on the batch's statistics (NaN
gradients here): MXNet's gradients are a training step's only.

Every layer is given its input width (``in_channels``, ``in_units``), so that every parameter
has its shape at construction and ``initialize`` sets it at once (no deferred initialization
waiting for a first batch). Nothing is cast to a dtype: AMP (``mxnet.contrib.amp``) converts
the model as it is.

Names: Gluon's own parameter names are counted prefixes (layer4.2.bn3's weight is
``resnet500_bottleneck15_batchnorm2_gamma``); the structured names ``save_parameters`` writes
are the attribute paths, torchvision's (``layer1.0.downsample.0.weight``), but a BatchNorm's
``gamma`` and ``beta`` are torch's ``weight`` and ``bias`` (``running_mean`` and
``running_var`` are the same words; they are parameters with ``grad_req="null"`` in MXNet,
buffers in torch). ``torch_named_shapes`` and ``load_torch_weights`` translate these two and
nothing else. Convolution weights are OIHW and
the classifier's ``Dense`` weight is (out, in) in both frameworks.

MXNet is imported inside functions only: the pytest side imports this module and has none.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from ...core.workload import BuildContext, Parts
from . import NUM_CLASSES

BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9  # MXNet's convention: torch's momentum 0.1
STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))  # (width, blocks) of layer1..layer4
TORCH_NAMES = {"gamma": "weight", "beta": "bias"}


def resnet50(num_classes: int = NUM_CLASSES, device: str = "cpu") -> Any:
    """torchvision's ResNet-50 (v1.5, NCHW) as a Gluon ``HybridBlock``, initialized as
    torchvision's on ``device`` ("cpu" or "cuda:N")."""
    model = _classes().ResNet50(num_classes)
    model.initialize(ctx=context(device))  # each layer's own initializers, given below
    return model


def recipe(ctx: BuildContext) -> Parts:
    """Random NCHW images resident on the device, fresh random labels every step; the loss is
    the default cross-entropy (logits [B, 1000] against int labels [B])."""
    import mxnet as mx

    device = context(ctx.device)
    model = resnet50(NUM_CLASSES, ctx.device)
    size = int(ctx.sizes["image_size"])
    images = mx.nd.random.normal(shape=(ctx.batch_size, 3, size, size), ctx=device)

    def fresh_labels() -> Any:  # drawn on the device, asynchronously
        return mx.nd.random.randint(0, NUM_CLASSES, shape=(ctx.batch_size,), ctx=device)

    return Parts(model=model, inputs=images, targets=fresh_labels)


def context(device: str) -> Any:
    """MXNet's context for a case's device: "cpu" or "cuda:N"."""
    import mxnet as mx

    if device == "cpu":
        return mx.cpu()
    kind, _, index = device.partition(":")
    if kind != "cuda":
        raise ValueError(f"MXNet runs on 'cpu' or 'cuda:N', not {device!r}")
    return mx.gpu(int(index or 0))


def named_parameters(model: Any) -> dict[str, Any]:
    """Every parameter (BatchNorm's running statistics included) under torchvision's name, in
    the model's (= torch's) order."""
    # The attribute paths, as save_parameters names them (Gluon 1.x's own names are counted
    # prefixes): a private method, stable through the 1.x line, which ends with 1.9.1.
    params = model._collect_params_with_prefix()
    return {torch_name(name): param for name, param in params.items()}


def torch_name(name: str) -> str:
    """torchvision's name for an MXNet parameter's path: BatchNorm's gamma and beta renamed."""
    head, _, leaf = name.rpartition(".")
    return f"{head}.{TORCH_NAMES.get(leaf, leaf)}"


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The trainable parameters under torchvision's names, in torch's order and layout: what
    the alignment test compares with torchvision's ``named_parameters()``."""
    return {name: tuple(int(d) for d in param.shape)
            for name, param in named_parameters(model).items() if param.grad_req != "null"}


def load_torch_weights(model: Any, arrays: Mapping[str, Any],
                       named: Callable[[Any], dict[str, Any]] | None = None) -> None:
    """Set every parameter, BatchNorm's running statistics included, from torchvision's
    ``state_dict()`` arrays by name (``num_batches_tracked`` left out; ``named``: the model's
    parameters under torch's names, this module's ``named_parameters`` by default). Refuses a
    missing or extra name and a shape that differs."""
    params = (named or named_parameters)(model)
    if set(params) != set(arrays):
        raise ValueError(f"torch names without a parameter: {sorted(set(arrays) - set(params))}; "
                         f"parameters without an array: {sorted(set(params) - set(arrays))}")
    for name, param in params.items():
        value = arrays[name]
        if tuple(value.shape) != tuple(param.shape):
            raise ValueError(f"{name}: torch's array is {tuple(value.shape)}, the parameter "
                             f"{tuple(param.shape)}")
        param.set_data(value.astype(param.dtype, copy=False))


@functools.cache
def _classes() -> SimpleNamespace:
    """The network's classes, defined on first use (they derive from Gluon's ``HybridBlock``)."""
    import mxnet as mx
    from mxnet.gluon import nn

    HybridBlock: Any = nn.HybridBlock

    def conv(width: int, out: int, kernel: int, stride: int = 1) -> Any:
        return nn.Conv2D(out, kernel, strides=stride, padding=kernel // 2, use_bias=False,
                         in_channels=width, weight_initializer=mx.init.MSRAPrelu("out", 0.0))

    def bn(width: int) -> Any:
        return nn.BatchNorm(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, in_channels=width)

    class Bottleneck(HybridBlock):  # type: ignore[misc]
        def __init__(self, width: int, planes: int, stride: int) -> None:
            super().__init__()
            with self.name_scope():
                self.conv1 = conv(width, planes, 1)
                self.bn1 = bn(planes)
                self.conv2 = conv(planes, planes, 3, stride)  # v1.5: the stride is here
                self.bn2 = bn(planes)
                self.conv3 = conv(planes, planes * 4, 1)
                self.bn3 = bn(planes * 4)
                self.downsample = None
                if stride != 1 or width != planes * 4:
                    self.downsample = nn.HybridSequential()
                    self.downsample.add(conv(width, planes * 4, 1, stride), bn(planes * 4))

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            out = F.relu(self.bn1(self.conv1(x)))
            out = F.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return F.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet50(HybridBlock):  # type: ignore[misc]
        def __init__(self, num_classes: int) -> None:
            super().__init__()
            with self.name_scope():
                self.conv1 = conv(3, 64, 7, 2)
                self.bn1 = bn(64)
                self.maxpool = nn.MaxPool2D(pool_size=3, strides=2, padding=1)
                width = 64
                for index, (planes, blocks) in enumerate(STAGES, start=1):
                    stage = nn.HybridSequential()
                    stage.add(Bottleneck(width, planes, 1 if index == 1 else 2))
                    stage.add(*(Bottleneck(planes * 4, planes, 1) for _ in range(blocks - 1)))
                    setattr(self, f"layer{index}", stage)
                    width = planes * 4
                bound = 1 / math.sqrt(width)  # torch's Linear: kaiming_uniform(a=sqrt(5)) = this
                self.fc = nn.Dense(num_classes, in_units=width,
                                   weight_initializer=mx.init.Uniform(bound),
                                   bias_initializer=mx.init.Uniform(bound))

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(F.mean(x, axis=(2, 3)))

    return SimpleNamespace(ResNet50=ResNet50)
