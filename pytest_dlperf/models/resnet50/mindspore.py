"""ResNet-50 v1.5 in MindSpore: torchvision's ``resnet50`` written from ``mindspore.nn``.

Why not mindcv's: ``mindcv==0.3.0``'s ``create_model("resnet50")`` is v1.5 with the same
25,557,032 parameters, but it would bring a second package (and PyYAML, tqdm) into MindSpore's
interpreter for ~60 lines of network, under names of its own (``classifier``, ``down_sample``)
and with a classifier initialized otherwise than torchvision's (He-uniform with a sigmoid gain:
bound 0.038, torchvision's 0.022). Written here, in torchvision's module order and under its
attribute names, it is one definition checked against torchvision layer for layer, as
``resnet50.tensorflow.resnet50_v15`` is for Keras.

What it matches, and why each is not MindSpore's default:

- convolutions padded symmetrically (``pad_mode="pad"``; MindSpore's default ``"same"`` pads a
  strided convolution on the right and bottom only) and without bias; the stride of a stage's
  first block on its 3x3 convolution (v1.5); the max pool padded by one;
- torchvision's initialization: convolutions He-normal over fan-out, BatchNorm scales one and
  shifts zero (the last BatchNorm of a block is not zeroed: torchvision's
  ``zero_init_residual`` is off by default), the classifier uniform in +-1/sqrt(2048) (weight
  and bias, as torch's ``Linear``);
- BatchNorm epsilon 1e-5 and momentum 0.9: MindSpore keeps ``momentum`` x the old statistics,
  so its 0.9 is torch's 0.1. Moving variance is updated with the unbiased batch variance, as
  torch's running variance is (measured).

Names: MindSpore lists the same parameters under the same paths (``layer1.0.downsample.0``), but
a BatchNorm's are ``gamma``, ``beta``, ``moving_mean``, ``moving_variance`` where torch's are
``weight``, ``bias``, ``running_mean``, ``running_var``: ``torch_named_shapes`` and
``load_torch_weights`` translate these four and nothing else. Convolution weights are OIHW and
the classifier's ``Dense`` weight is (out, in) in both frameworks.

The NaN seen with mindcv's model (loss 63.9 at the first step, NaN by the third, at lr 0.01 and
momentum 0.9 on random data) is MindSpore's training flag, not the model: a ``Cell`` is built
with ``training`` off, and a BatchNorm out of training normalizes with its moving statistics,
which start at mean 0 and variance 1, so it normalizes nothing. Through 53 layers initialized
for normalized activations, the logits of a random image reach ~60 (reproduced with mindcv:
loss 63.3, then 8.8e7, then NaN; the moving statistics never move). After ``set_train(True)``
the same model starts at 7.25 (ln 1000 = 6.9). The learning rate then matters second: 0.01 for
a batch of 2 is 13x the linear-scaling rule's 0.1 x 2 / 256, and the loss climbed 7.2 -> 31.5
in six steps even in training mode; at the rule's rate it stayed within 6.9-10.3 over 25 steps.
This model out of training mode starts at 24, then 120; in it, at the rule's rate with momentum
0.9 and weight decay 1e-4 (64x64, batch 2), 6.88 then 6.2-9.2 over 25 steps of fresh random
labels (torchvision's: 6.5-8.9), and 6.88 down to 0.001 on one fixed batch. ``resnet50()``
returns the model in training mode, and an adapter must keep it so for its steps
(``set_train(False)`` only to evaluate).

Layout: NCHW, the only one MindSpore 2.10's CPU convolutions take (``data_format="NHWC"`` is
GPU-only). They run oneDNN's plain-layout kernel (``jit_uni_ncsp:conv+ref``): a 3x3 convolution
of 64 channels at 16x16, batch 2, takes 50-100 ms where torch's takes 0.3 ms, so a CPU step of
this model costs ~3 s in PyNative and in GRAPH mode alike (torchvision's: ~0.5 s).

MindSpore is imported inside functions only: the pytest side imports this module and has none.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from ...core.workload import BuildContext, Parts
from . import NUM_CLASSES

BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9  # MindSpore's convention: torch's momentum 0.1
STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))  # (width, blocks) of layer1..layer4
TORCH_NAMES = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean",
               "moving_variance": "running_var"}


def resnet50(num_classes: int = NUM_CLASSES) -> Any:
    """torchvision's ResNet-50 (v1.5, NCHW) as a MindSpore ``Cell``, in training mode."""
    model = _classes().ResNet50(num_classes)
    model.set_train(True)
    return model


def recipe(ctx: BuildContext) -> Parts:
    """Random NCHW images resident on the device, fresh random labels every step; the loss is
    the default cross-entropy (logits [B, 1000] against int labels [B])."""
    import mindspore as ms
    from mindspore import ops

    # No device arguments: MindSpore's device is its context's, set by the adapter.
    model = resnet50()
    size = int(ctx.sizes["image_size"])
    images = ops.randn(ctx.batch_size, 3, size, size)

    def fresh_labels() -> Any:
        return ops.randint(0, NUM_CLASSES, (ctx.batch_size,), dtype=ms.int32)

    return Parts(model=model, inputs=images, targets=fresh_labels)


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The trainable parameters under torchvision's names, in MindSpore's (= torch's) order and
    layout: what the alignment test compares with torchvision's ``named_parameters()``."""
    return {torch_name(name): tuple(int(d) for d in param.shape)
            for name, param in model.parameters_and_names() if param.requires_grad}


def torch_name(name: str) -> str:
    """torchvision's name for a MindSpore parameter: BatchNorm's four are renamed."""
    head, _, leaf = name.rpartition(".")
    return f"{head}.{TORCH_NAMES.get(leaf, leaf)}"


def load_torch_weights(model: Any, arrays: Mapping[str, Any]) -> None:
    """Set every parameter, BatchNorm's moving statistics included, from torchvision's
    ``state_dict()`` arrays by name (``num_batches_tracked`` left out). Refuses a missing or
    extra name and a shape that differs."""
    set_by_name({torch_name(name): param for name, param in model.parameters_and_names()},
                arrays)


def set_by_name(params: Mapping[str, Any], arrays: Mapping[str, Any]) -> None:
    """Each of ``params`` (MindSpore parameters under torch's names) set from torch's array of
    that name; a missing or extra name, or a shape that differs, is refused. BERT's loader too."""
    import mindspore as ms

    if set(params) != set(arrays):
        raise ValueError(f"torch names without a parameter: {sorted(set(arrays) - set(params))}; "
                         f"parameters without an array: {sorted(set(params) - set(arrays))}")
    for name, param in params.items():
        value = arrays[name]
        if tuple(value.shape) != tuple(param.shape):
            raise ValueError(f"{name}: torch's array is {tuple(value.shape)}, the parameter "
                             f"{tuple(param.shape)}")
        param.set_data(ms.Tensor(value, param.dtype))


@functools.cache
def _classes() -> SimpleNamespace:
    """The network's classes, defined on first use (they derive from MindSpore's ``Cell``)."""
    from mindspore import nn, ops
    from mindspore.common.initializer import HeNormal, HeUniform, Uniform

    Cell: Any = nn.Cell

    def conv(width: int, out: int, kernel: int, stride: int = 1) -> Any:
        return nn.Conv2d(width, out, kernel, stride=stride, pad_mode="pad", padding=kernel // 2,
                         has_bias=False,
                         weight_init=HeNormal(mode="fan_out", nonlinearity="relu"))

    def bn(width: int) -> Any:
        return nn.BatchNorm2d(width, eps=BN_EPSILON, momentum=BN_MOMENTUM)

    class Bottleneck(Cell):  # type: ignore[misc]
        def __init__(self, width: int, planes: int, stride: int) -> None:
            super().__init__()
            self.conv1 = conv(width, planes, 1)
            self.bn1 = bn(planes)
            self.conv2 = conv(planes, planes, 3, stride)  # v1.5: the stride is here
            self.bn2 = bn(planes)
            self.conv3 = conv(planes, planes * 4, 1)
            self.bn3 = bn(planes * 4)
            self.relu = nn.ReLU()
            self.has_downsample = stride != 1 or width != planes * 4
            if self.has_downsample:
                self.downsample = nn.SequentialCell([conv(width, planes * 4, 1, stride),
                                                     bn(planes * 4)])

        def construct(self, x: Any) -> Any:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (self.downsample(x) if self.has_downsample else x))

    class ResNet50(Cell):  # type: ignore[misc]
        def __init__(self, num_classes: int) -> None:
            super().__init__()
            self.conv1 = conv(3, 64, 7, 2)
            self.bn1 = bn(64)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
            width = 64
            for index, (planes, blocks) in enumerate(STAGES, start=1):
                stage = [Bottleneck(width, planes, 1 if index == 1 else 2)]
                stage += [Bottleneck(planes * 4, planes, 1) for _ in range(blocks - 1)]
                setattr(self, f"layer{index}", nn.SequentialCell(stage))
                width = planes * 4
            bound = 1 / math.sqrt(width)  # torch's Linear: kaiming_uniform(a=sqrt(5)) = this
            self.fc = nn.Dense(width, num_classes, weight_init=HeUniform(math.sqrt(5)),
                               bias_init=Uniform(bound))

        def construct(self, x: Any) -> Any:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(ops.mean(x, (2, 3)))

    return SimpleNamespace(ResNet50=ResNet50)
