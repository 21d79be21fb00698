"""ResNet-50 v1.5 in PaddlePaddle: ``paddle.vision``'s model, under torchvision's names."""

from __future__ import annotations

from typing import Any

from ...core.workload import BuildContext, Parts
from . import NUM_CLASSES


def recipe(ctx: BuildContext) -> Parts:
    import paddle

    # The adapter has made the case's device Paddle's current one: tensors are created there.
    model = paddle.vision.models.resnet50(num_classes=NUM_CLASSES)
    size = int(ctx.sizes["image_size"])
    images = paddle.randn([ctx.batch_size, 3, size, size])

    def fresh_labels() -> Any:
        return paddle.randint(0, NUM_CLASSES, [ctx.batch_size])

    return Parts(model=model, inputs=images, targets=fresh_labels)


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """Paddle's trainable parameters under torchvision's names, in torch's layout: the names
    are torchvision's already (``paddle.vision`` follows it; BatchNorm's running statistics,
    ``_mean`` and ``_variance``, are non-trainable parameters and left out), and a Linear
    weight is (in, out) in Paddle, (out, in) in torch."""
    shapes = {}
    for name, param in model.named_parameters():
        if param.stop_gradient:
            continue
        shape = tuple(int(d) for d in param.shape)
        shapes[name] = shape[::-1] if len(shape) == 2 else shape
    return shapes
