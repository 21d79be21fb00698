"""InsightFace in OneFlow (``insightface`` holds the sizes and the arithmetic): the backbones of
``torch`` (IResNet, MobileFaceNet) rebuilt from ``oneflow.nn`` layer for layer under
the same names (the alignment test loads torch's weights into it by name and compares the loss),
the margin head and the recipe.

The head is one module, ``MarginHead``: ``head(embeddings, labels) -> loss``, the whole softmax
over every class on one rank. Its margin is OneFlow's fused ``combined_margin_loss`` (oneflow_face
uses it: cos(acos x + 0.5) on each row's own class for ArcFace, x - 0.4 for CosFace), whose SBP
signature takes cosines split by class. Under a ``pfc`` layout the adapter's strategy
(``frameworks/oneflow/classes.py``) makes its centres a global tensor split by class and gives
it a ``split`` that computes the same loss from the split centres (the recipe names the head in
``Parts.plans["pfc"]``); the model returns the loss itself, so the trainer's loss passes it on.

OneFlow is imported inside functions only: the pytest side imports this module and has no
OneFlow.
"""

from __future__ import annotations

from typing import Any

from ...core.workload import BuildContext, Parts
from . import BACKBONES, MARGINS, FaceShape


def _iresnet(blocks: tuple[int, ...], embedding: int) -> Any:
    """insightface's IResNet, as ``torch._iresnet``: a 3x3 stem at 112 x 112, four
    stages of pre-activation basic blocks halving to 7 x 7, then BN, a fully connected layer to
    the embedding and BN of it."""
    import oneflow as flow

    nn: Any = flow.nn

    class Block(nn.Module):  # type: ignore[misc]
        def __init__(self, inplanes: int, planes: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.BatchNorm2d(inplanes, eps=1e-5), nn.Conv2d(inplanes, planes, 3, 1, 1,
                                                               bias=False),
                nn.BatchNorm2d(planes, eps=1e-5), nn.PReLU(planes),
                nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes))
            self.down = None if stride == 1 and inplanes == planes else nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

        def forward(self, x: Any) -> Any:
            return self.body(x) + (x if self.down is None else self.down(x))

    layers: list[Any] = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.PReLU(64)]
    width = 64
    for planes, count in zip((64, 128, 256, 512), blocks):
        layers += [Block(width, planes, 2)] + [Block(planes, planes, 1) for _ in range(count - 1)]
        width = planes
    layers += [nn.BatchNorm2d(512), nn.Flatten(), nn.Linear(512 * 7 * 7, embedding),
               nn.BatchNorm1d(embedding)]
    return nn.Sequential(*layers)


def _mobilefacenet(embedding: int) -> Any:
    """MobileFaceNet, as ``torch._mobilefacenet``: inverted-residual bottlenecks to
    128 channels at 7 x 7, a 1x1 to 512, a global depthwise 7x7 (GDConv) and a linear 1x1 to
    the embedding."""
    import oneflow as flow

    nn: Any = flow.nn

    def conv(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
             act: bool = True) -> list[Any]:
        return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2 if kernel == 3 else 0,
                          groups=groups, bias=False), nn.BatchNorm2d(cout)] + (
            [nn.PReLU(cout)] if act else [])

    class Bottleneck(nn.Module):  # type: ignore[misc]
        def __init__(self, cin: int, cout: int, stride: int, expansion: int) -> None:
            super().__init__()
            wide = cin * expansion
            self.body = nn.Sequential(*conv(cin, wide, 1), *conv(wide, wide, 3, stride, wide),
                                      *conv(wide, cout, 1, act=False))
            self.residual = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            return x + self.body(x) if self.residual else self.body(x)

    layers = [*conv(3, 64, 3, 2), *conv(64, 64, 3, 1, 64)]
    width = 64
    for expansion, out, count, stride in ((2, 64, 5, 2), (4, 128, 1, 2), (2, 128, 6, 1),
                                          (4, 128, 1, 2), (2, 128, 2, 1)):
        for i in range(count):
            layers.append(Bottleneck(width, out, stride if i == 0 else 1, expansion))
            width = out
    layers += [*conv(128, 512, 1), *conv(512, 512, 7, groups=512, act=False),
               nn.Conv2d(512, embedding, 1, bias=False), nn.BatchNorm2d(embedding), nn.Flatten()]
    return nn.Sequential(*layers)


def wide(tensor: Any) -> Any:
    """``tensor`` in float32 at least (an AMP matmul's half precision widened; float64 kept)."""
    import oneflow as flow

    return tensor.float() if tensor.dtype in (flow.float16, flow.bfloat16) else tensor


def build(shape: FaceShape, backbone: Any = None) -> Any:
    """The model: ``model(images, labels)`` -> the batch's mean loss. ``backbone``: a module of
    one's own in place of the shape's (the layouts' equivalence tests use a small one)."""
    import oneflow as flow

    nn: Any = flow.nn
    # combined_margin_loss's (m1, m2, m3): cos(m1 acos x + m2) - m3 on each row's own class.
    margins = ((1.0, MARGINS["arcface"], 0.0) if shape.margin == "arcface"
               else (1.0, 0.0, MARGINS["cosface"]))

    class MarginHead(nn.Module):  # type: ignore[misc]
        """The centres of every class and the margin loss over them."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(flow.empty(shape.num_classes, shape.embedding))
            nn.init.normal_(self.weight, std=0.01)
            self.split: Any = None  # set by the pfc strategy: the loss from split centres

        def logits(self, cosine: Any, target: Any) -> Any:
            """Scaled logits from ``cosine`` [B, C], the margin on each row's own class at
            column ``target`` (a global ``cosine`` may be split by class: the fused op's SBP
            finds each rank's columns)."""
            m1, m2, m3 = margins
            return flow._C.combined_margin_loss(cosine, target, m1=m1, m2=m2, m3=m3) * (
                shape.scale)

        def forward(self, embeddings: Any, labels: Any) -> Any:
            if self.split is not None:
                return self.split(self, embeddings, labels)
            norm = nn.functional.normalize
            cosine = wide(norm(embeddings, dim=1).matmul(norm(self.weight, dim=1).t()))
            return nn.functional.cross_entropy(self.logits(cosine, labels), labels)

    class Face(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            blocks = BACKBONES[shape.backbone]
            self.backbone = backbone if backbone is not None else (
                _mobilefacenet(shape.embedding) if blocks is None
                else _iresnet(blocks, shape.embedding))
            self.head = MarginHead()

        def forward(self, images: Any, labels: Any) -> Any:
            return self.head(self.backbone(images), labels)

    return Face()


def recipe(ctx: BuildContext, backbone: Any = None) -> Parts:
    import oneflow as flow

    shape = FaceShape.of(ctx.sizes)
    batch, device = ctx.batch_size, ctx.device
    # The same weights on every rank, whatever the rank's own seed (the adapter seeds the
    # data after the recipe).
    flow.manual_seed(ctx.seed)
    model = build(shape, backbone)
    generator = flow.Generator(device=flow.device(device).type)
    generator.manual_seed(ctx.seed * 1_000_003 + ctx.rank)
    images = flow.randn(batch, 3, shape.image, shape.image, generator=generator, device=device)
    labels: list[Any] = [None]

    def fresh() -> Any:  # labels drawn afresh: the classes a step touches move
        labels[0] = flow.randint(0, shape.num_classes, (batch,), generator=generator,
                                 device=device)
        return images, labels[0]

    return Parts(model=model, inputs=fresh, targets=lambda: labels[0],
                 loss=lambda loss, _labels: loss, plans={"pfc": "head"})
