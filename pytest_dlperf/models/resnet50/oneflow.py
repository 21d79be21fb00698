"""ResNet-50 v1.5 in OneFlow: flowvision's model, torchvision's twin."""

from __future__ import annotations

from typing import Any

from ...core.workload import BuildContext, Parts
from . import NUM_CLASSES


def recipe(ctx: BuildContext) -> Parts:
    import flowvision
    import oneflow as flow

    model = flowvision.models.resnet50(num_classes=NUM_CLASSES)
    size = int(ctx.sizes["image_size"])
    images = flow.randn(ctx.batch_size, 3, size, size, device=ctx.device)

    def fresh_labels() -> Any:
        return flow.randint(0, NUM_CLASSES, (ctx.batch_size,), device=ctx.device)

    return Parts(model=model, inputs=images, targets=fresh_labels)
