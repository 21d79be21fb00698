"""InsightFace in torch (``insightface`` holds the sizes and the arithmetic): the backbones
(IResNet, MobileFaceNet), the margin head and the recipe.

The head is one module, ``MarginHead``: ``head(embeddings, labels) -> loss``, the whole softmax
over every class on one rank. Under a ``pfc`` layout the adapter's strategy
(``frameworks/torch/classes.py``) splits its centres by class over the ranks and gives it a
``split`` that computes the same loss from this rank's classes (the recipe names the head in
``Parts.plans["pfc"]``); the model returns the loss itself, so the trainer's loss passes it on.
"""

from __future__ import annotations

from typing import Any

from ...core.workload import BuildContext, Parts
from . import BACKBONES, MARGINS, FaceShape


def _iresnet(blocks: tuple[int, ...], embedding: int) -> Any:
    """insightface's IResNet (arcface_torch's ``iresnet``): a 3x3 stem at 112 x 112, four stages
    of pre-activation basic blocks (BN, 3x3, BN, PReLU, 3x3 strided, BN) halving to 7 x 7, then
    BN, a fully connected layer to the embedding and BN of it."""
    from torch import nn

    class Block(nn.Module):
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
    """MobileFaceNet (Chen et al. 2018, the table of its paper): a strided 3x3 and a depthwise
    3x3 at 64 channels, inverted-residual bottlenecks to 128 channels at 7 x 7, a 1x1 to 512,
    a global depthwise 7x7 (GDConv) and a linear 1x1 to the embedding, BN after each, PReLU
    after the non-linear ones."""
    from torch import nn

    def conv(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
             act: bool = True) -> list[Any]:
        return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2 if kernel == 3 else 0,
                          groups=groups, bias=False), nn.BatchNorm2d(cout)] + (
            [nn.PReLU(cout)] if act else [])

    class Bottleneck(nn.Module):
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
    """``tensor`` in float32 at least (an autocast matmul's half precision widened; float64
    kept)."""
    import torch

    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def build(shape: FaceShape, backbone: Any = None) -> Any:
    """The model: ``model(images, labels)`` -> the batch's mean loss. ``backbone``: a module of
    one's own in place of the shape's (the layouts' equivalence tests use a small one)."""
    import torch

    class MarginHead(torch.nn.Module):
        """The centres of every class and the margin loss over them."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(shape.num_classes, shape.embedding))
            torch.nn.init.normal_(self.weight, std=0.01)
            self.split: Any = None  # set by the pfc strategy: this rank's classes' loss

        def logits(self, cosine: Any, target: Any) -> Any:
            """Scaled logits from ``cosine`` [B, C'], the margin on each row's own class at
            column ``target`` (-1: its class is not among these columns)."""
            # No data-dependent shapes (FLOPs are counted on the meta device): the margin's
            # change added at every row's column, zero where the row's class is elsewhere.
            column = target.clamp_min(0).unsqueeze(1)
            own = cosine.gather(1, column).squeeze(1)
            if shape.margin == "arcface":
                moved = torch.cos(torch.acos(own.clamp(-1 + 1e-7, 1 - 1e-7))
                                  + MARGINS["arcface"])
            else:
                moved = own - MARGINS["cosface"]
            change = torch.where(target >= 0, moved - own, torch.zeros_like(own))
            return cosine.scatter_add(1, column, change.unsqueeze(1)) * shape.scale

        def forward(self, embeddings: Any, labels: Any) -> Any:
            if self.split is not None:
                return self.split(self, embeddings, labels)
            norm = torch.nn.functional.normalize
            cosine = wide(norm(embeddings).matmul(norm(self.weight).t()))
            return torch.nn.functional.cross_entropy(self.logits(cosine, labels), labels)

    class Face(torch.nn.Module):
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
    import torch

    shape = FaceShape.of(ctx.sizes)
    batch, device = ctx.batch_size, ctx.device
    # The same weights on every rank; none at all on the meta device (FLOPs are counted there,
    # in rank 0 beside its own model).
    with torch.random.fork_rng(devices=[]), torch.device(
            "meta" if device == "meta" else "cpu"):
        torch.manual_seed(ctx.seed)
        model = build(shape, backbone)
    generator = None
    if device != "meta":
        generator = torch.Generator(device=device)
        generator.manual_seed(ctx.seed * 1_000_003 + ctx.rank)
    images = torch.randn(batch, 3, shape.image, shape.image, device=device, generator=generator)
    labels = torch.empty(batch, dtype=torch.long, device=device)

    def fresh() -> Any:  # labels drawn afresh: the classes a step touches move
        return images, labels.random_(0, shape.num_classes, generator=generator)

    return Parts(model=model, inputs=fresh, targets=lambda: labels,
                 loss=lambda loss, _labels: loss, plans={"pfc": "head"})
