"""InsightFace in MXNet Gluon (``insightface`` holds the sizes and the arithmetic): the backbones
(IResNet, MobileFaceNet), the margin head and the recipe, written from ``mxnet.gluon.nn`` in the
module order and under the attribute names of ``torch``, so that torch's weights
load by name and give torch's loss (tests/test_insightface_mxnet.py).

DLPerf's InsightFace runs compared OneFlow with deepinsight's MXNet insightface; its model is
the one written here (an IResNet or MobileFaceNet to a 512-d embedding, the centres and the
embeddings L2-normalized, ArcFace's angular or CosFace's cosine margin on the own class, the
scale, softmax cross-entropy). The model is ``model(images, labels) -> loss``, the whole softmax
over every class on each rank; under the ``pfc`` layout kind the adapter's strategy
(``frameworks/mxnet/classes.py``) keeps this rank's classes of the head and sets its ``split``,
which the head's forward hands the loss to (eager only).

What it matches of torch's: convolutions and the backbone's linear layer without bias where
torch has none, initialized as torch's defaults (uniform within 1 / sqrt(fan in): torch's
``kaiming_uniform_(a=sqrt(5))``); BatchNorm epsilon 1e-5 and momentum 0.9 (MXNet keeps
momentum x the old statistics: torch's 0.1); PReLU's slope 0.25 a channel; the head's centres
normal with std 0.01. Names: a BatchNorm's ``gamma`` and ``beta`` and a PReLU's ``alpha`` are
torch's ``weight`` and ``bias`` and ``weight``; ``load_torch_weights`` renames these and nothing
else. MXNet's BatchNorm moves its running statistics in backward and with the batch's biased
variance (``resnet50.mxnet`` measured it); a training step normalizes with the batch's in both.

MXNet is imported inside functions only: the pytest side imports this module and has none.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from ...core.workload import BuildContext, Parts
from ..resnet50 import mxnet as resnet50_mxnet
from ..resnet50.mxnet import context
from . import BACKBONES, MARGINS, FaceShape

BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9  # MXNet's convention: torch's momentum 0.1
TORCH_NAMES = {"gamma": "weight", "beta": "bias", "alpha": "weight"}
# MobileFaceNet's bottleneck stages: (expansion, out channels, blocks, first stride)
MOBILE_STAGES = ((2, 64, 5, 2), (4, 128, 1, 2), (2, 128, 6, 1), (4, 128, 1, 2), (2, 128, 2, 1))


def build(shape: FaceShape, backbone: Any = None, device: str = "cpu") -> Any:
    """The model, initialized on ``device``: ``model(images, labels)`` -> the batch's mean
    loss. ``backbone``: a block of one's own (initialized by this call) in place of the
    shape's."""
    blocks = BACKBONES[shape.backbone]
    if backbone is None:
        backbone = (mobilefacenet(shape.embedding) if blocks is None
                    else iresnet(blocks, shape.embedding))
    model = _face_blocks().Face(backbone, shape)
    model.initialize(ctx=context(device))  # each layer's own initializers
    return model


def recipe(ctx: BuildContext, backbone: Any = None) -> Parts:
    """One batch of normal images resident on the device (this rank's own), labels drawn
    afresh over every class each step; the model returns the loss, passed on as it is."""
    import mxnet as mx

    shape = FaceShape.of(ctx.sizes)
    device = context(ctx.device)
    mx.random.seed(ctx.seed)  # the same weights on every rank
    model = build(shape, backbone, ctx.device)
    mx.random.seed(ctx.seed * 1_000_003 + ctx.rank)  # this rank's images
    images = mx.nd.random.normal(shape=(ctx.batch_size, 3, shape.image, shape.image),
                                 ctx=device)
    drawn: list[Any] = [None]

    def fresh() -> Any:  # the classes a step touches move (drawn on the device, asynchronously)
        drawn[0] = mx.nd.random.randint(0, shape.num_classes, shape=(ctx.batch_size,),
                                        ctx=device)
        return images, drawn[0]

    return Parts(model=model, inputs=fresh, targets=lambda: drawn[0],
                 loss=lambda loss, _labels: loss, plans={"pfc": "head"})


def named_parameters(model: Any) -> dict[str, Any]:
    """Every parameter (BatchNorm's running statistics included) under torch's name."""
    # The attribute paths, as save_parameters names them (Gluon 1.x's own names are counted
    # prefixes): a private method, stable through the 1.x line, which ends with 1.9.1.
    params = model._collect_params_with_prefix()
    return {torch_name(name): param for name, param in params.items()}


def torch_name(name: str) -> str:
    head, _, leaf = name.rpartition(".")
    return f"{head}.{TORCH_NAMES.get(leaf, leaf)}"


def load_torch_weights(model: Any, arrays: Mapping[str, Any]) -> None:
    """torch's ``state_dict()`` arrays by name into the model (ResNet-50's loader, under this
    module's names)."""
    resnet50_mxnet.load_torch_weights(model, arrays, named_parameters)


def margin_logits(F: Any, cosine: Any, labels: Any, shape: FaceShape,
                  depth: int | None = None, dtype: str = "float32") -> Any:
    """Scaled logits from ``cosine`` [B, C], the margin on each row's own class (torch's
    ``MarginHead.logits``): the change at the own column added through a one-hot (of
    ``depth`` columns, the classes' where not given; a label outside them, as -1, none), in the
    cosines' ``dtype``."""
    own = F.pick(cosine, labels, axis=1)
    if shape.margin == "arcface":
        moved = F.cos(F.arccos(F.clip(own, -1 + 1e-7, 1 - 1e-7)) + MARGINS["arcface"])
    else:
        moved = own - MARGINS["cosface"]
    change = F.broadcast_mul(F.one_hot(labels, depth=depth or shape.num_classes, dtype=dtype),
                             F.expand_dims(moved - own, axis=1))  # a symbol broadcasts no `*`
    return (cosine + change) * shape.scale


def _conv(cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0,
          groups: int = 1) -> Any:
    import mxnet as mx

    bound = 1 / math.sqrt(cin // groups * kernel * kernel)  # torch's default
    return mx.gluon.nn.Conv2D(cout, kernel, strides=stride, padding=padding, groups=groups,
                              use_bias=False, in_channels=cin,
                              weight_initializer=mx.init.Uniform(bound))


def _bn(width: int) -> Any:
    import mxnet as mx

    return mx.gluon.nn.BatchNorm(axis=1, momentum=BN_MOMENTUM, epsilon=BN_EPSILON,
                                 in_channels=width)


def _prelu(width: int) -> Any:
    import mxnet as mx

    return mx.gluon.nn.PReLU(alpha_initializer=mx.init.Constant(0.25), in_channels=width)


def _sequential(*layers: Any) -> Any:
    import mxnet as mx

    seq = mx.gluon.nn.HybridSequential()
    seq.add(*layers)
    return seq


def _unit(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
          act: bool = True) -> list[Any]:
    """MobileFaceNet's conv, BN (and PReLU); padded by one where the kernel is 3."""
    layers = [_conv(cin, cout, kernel, stride, 1 if kernel == 3 else 0, groups), _bn(cout)]
    return layers + ([_prelu(cout)] if act else [])


def iresnet(blocks: tuple[int, ...], embedding: int) -> Any:
    """insightface's IResNet (``torch._iresnet``): a 3x3 stem at 112 x 112, four
    stages of pre-activation basic blocks halving to 7 x 7, then BN, a linear layer to the
    embedding and BN of it."""
    import mxnet as mx

    block = _backbone_blocks().IBlock
    layers: list[Any] = [_conv(3, 64, 3, 1, 1), _bn(64), _prelu(64)]
    width = 64
    for planes, count in zip((64, 128, 256, 512), blocks):
        layers += [block(width, planes, 2)] + [block(planes, planes, 1) for _ in range(count - 1)]
        width = planes
    bound = 1 / math.sqrt(512 * 7 * 7)  # torch's Linear, weight and bias
    layers += [_bn(512), mx.gluon.nn.Flatten(),
               mx.gluon.nn.Dense(embedding, in_units=512 * 7 * 7,
                                 weight_initializer=mx.init.Uniform(bound),
                                 bias_initializer=mx.init.Uniform(bound)),
               _bn(embedding)]
    return _sequential(*layers)


def mobilefacenet(embedding: int) -> Any:
    """MobileFaceNet (``torch._mobilefacenet``): inverted-residual bottlenecks to
    128 channels at 7 x 7, a 1x1 to 512, a global depthwise 7x7 and a linear 1x1."""
    import mxnet as mx

    bottleneck = _backbone_blocks().Bottleneck
    layers = [*_unit(3, 64, 3, 2), *_unit(64, 64, 3, 1, 64)]
    width = 64
    for expansion, out, count, stride in MOBILE_STAGES:
        for i in range(count):
            layers.append(bottleneck(width, out, stride if i == 0 else 1, expansion))
            width = out
    layers += [*_unit(128, 512, 1), *_unit(512, 512, 7, groups=512, act=False),
               _conv(512, embedding, 1), _bn(embedding), mx.gluon.nn.Flatten()]
    return _sequential(*layers)


@functools.cache
def _backbone_blocks() -> SimpleNamespace:
    """The backbones' residual blocks, defined on first use (Gluon ``HybridBlock``s)."""
    import mxnet as mx

    HybridBlock: Any = mx.gluon.nn.HybridBlock

    class IBlock(HybridBlock):  # type: ignore[misc]
        """IResNet's pre-activation basic block (BN, 3x3, BN, PReLU, 3x3 strided, BN)."""

        def __init__(self, inplanes: int, planes: int, stride: int) -> None:
            super().__init__()
            with self.name_scope():
                self.body = _sequential(_bn(inplanes), _conv(inplanes, planes, 3, 1, 1),
                                        _bn(planes), _prelu(planes),
                                        _conv(planes, planes, 3, stride, 1), _bn(planes))
                self.down = None if stride == 1 and inplanes == planes else _sequential(
                    _conv(inplanes, planes, 1, stride), _bn(planes))

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            return self.body(x) + (x if self.down is None else self.down(x))

    class Bottleneck(HybridBlock):  # type: ignore[misc]
        def __init__(self, cin: int, cout: int, stride: int, expansion: int) -> None:
            super().__init__()
            wide = cin * expansion
            with self.name_scope():
                self.body = _sequential(*_unit(cin, wide, 1),
                                        *_unit(wide, wide, 3, stride, wide),
                                        *_unit(wide, cout, 1, act=False))
            self.residual = stride == 1 and cin == cout

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            return x + self.body(x) if self.residual else self.body(x)

    return SimpleNamespace(IBlock=IBlock, Bottleneck=Bottleneck)


@functools.cache
def _face_blocks() -> SimpleNamespace:
    """The head and the whole model, defined on first use (Gluon ``HybridBlock``s)."""
    import mxnet as mx

    HybridBlock: Any = mx.gluon.nn.HybridBlock

    class MarginHead(HybridBlock):  # type: ignore[misc]
        """The centres of every class and the margin loss over them, in float32 (AMP's
        reduced-precision matmul widened, as torch's ``wide``)."""

        def __init__(self, shape: FaceShape) -> None:
            super().__init__()
            self.shape = shape
            with self.name_scope():
                self.weight = self.params.get("weight", shape=(shape.num_classes,
                                                               shape.embedding),
                                              init=mx.init.Normal(0.01))
            self.split: Any = None  # pfc's loss over a class-split head (frameworks.mxnet.classes)
            self.wide = "float32"  # the cosines' type: float32 at least (float64 cast)

        def cast(self, dtype: Any) -> None:
            self.wide = "float64" if str(dtype) == "float64" else "float32"
            super().cast(dtype)

        def logits(self, cosine: Any, target: Any) -> Any:
            """The margin and the scale on NDArray cosines with this rank's columns (a target
            of -1: the row's class is another rank's)."""
            return margin_logits(mx.nd, cosine, target, self.shape, cosine.shape[1],
                                 __import__("numpy").dtype(cosine.dtype).name)

        def hybrid_forward(self, F: Any, embeddings: Any, labels: Any, weight: Any) -> Any:
            if self.split is not None:  # eager only: the split's collectives are NDArrays'
                return self.split(self, embeddings, labels, weight)
            norm = functools.partial(F.L2Normalization, mode="instance", eps=1e-24)
            cosine = F.cast(F.dot(norm(embeddings), norm(weight), transpose_b=True), self.wide)
            logits = margin_logits(F, cosine, labels, self.shape, dtype=self.wide)
            return F.mean(-F.pick(F.log_softmax(logits, axis=1), labels, axis=1))

    class Face(HybridBlock):  # type: ignore[misc]
        def __init__(self, backbone: Any, shape: FaceShape) -> None:
            super().__init__()
            with self.name_scope():
                self.backbone = backbone
                self.head = MarginHead(shape)

        def hybrid_forward(self, F: Any, images: Any, labels: Any) -> Any:
            return self.head(self.backbone(images), labels)

    return SimpleNamespace(Face=Face)
