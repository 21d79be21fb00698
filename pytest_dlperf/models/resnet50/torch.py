"""ResNet-50 v1.5 in torch: torchvision's model (v1.5: stride 2 on the 3x3 conv)."""

from __future__ import annotations

from typing import Any

from ...core.workload import BuildContext, Parts
from . import NUM_CLASSES


def recipe(ctx: BuildContext) -> Parts:
    import torch
    import torchvision

    # channels_last on CUDA: cuDNN's fastest convolutions (tensor cores) want NHWC; moving the
    # model to the device keeps the format.
    fmt = torch.channels_last if ctx.device_type == "cuda" else torch.contiguous_format
    model = torchvision.models.resnet50(num_classes=NUM_CLASSES).to(memory_format=fmt)
    size = int(ctx.sizes["image_size"])
    images = torch.randn(ctx.batch_size, 3, size, size, device=ctx.device).contiguous(
        memory_format=fmt)
    labels = torch.zeros(ctx.batch_size, dtype=torch.long, device=ctx.device)

    def fresh_labels() -> Any:  # one tiny kernel, in place
        return torch.randint(0, NUM_CLASSES, labels.shape, out=labels)

    return Parts(model=model, inputs=images, targets=fresh_labels)
