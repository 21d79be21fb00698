"""What one case trains: model, per-device batch, image size, optimizer; sized per device type.

The GPU sizes are DLPerf's (ResNet-50 v1.5: 224x224, batch 128 FP32 / 256 AMP per device). The CPU
sizes keep the same model and algorithm but few pixels and tiny batches, so a 2-core machine runs
a case in seconds: the point on CPU is the harness, not the number.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class Workload:
    model: str
    batch_size: int
    image_size: int
    num_classes: int = 1000
    lr_per_256: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0

    def to_spec(self, world_size: int) -> dict[str, object]:
        """The worker-facing part of the JSON spec.

        The learning rate follows the linear scaling rule (0.1 per 256 samples of global batch,
        as in DLPerf's ResNet-50 scripts): a tiny CPU batch with ImageNet's lr blows the loss up.
        """
        data = asdict(self)
        lr = data.pop("lr_per_256") * self.batch_size * world_size / 256
        data["optimizer"] = {"lr": lr, "momentum": data.pop("momentum"),
                             "weight_decay": data.pop("weight_decay")}
        return data


# (device type, amp) -> (batch per device, image size)
_SIZES = {
    ("cuda", False): (128, 224),
    ("cuda", True): (256, 224),
    # 64x64 leaves 2x2 maps after layer4. At 32x32 (1x1 maps) BatchNorm over a batch of 2
    # normalizes two values to +-1 whatever they were, and the loss climbs into the thousands.
    ("cpu", False): (2, 64),
    ("cpu", True): (2, 64),
}


def default_workload(model: str, device_type: str, amp: bool, batch_size: int | None = None,
                     image_size: int | None = None, lr_per_256: float | None = None) -> Workload:
    batch, size = _SIZES[(device_type, amp)]
    workload = Workload(model=model, batch_size=batch_size or batch, image_size=image_size or size)
    return workload if lr_per_256 is None else replace(workload, lr_per_256=lr_per_256)


@dataclass(frozen=True)
class Precision:
    """The ``amp`` axis. AMP is fp16 autocast with loss scaling on CUDA and bf16 autocast on
    CPU (bf16 keeps fp32's exponent range, so it needs no scaler)."""

    name: str  # "fp32" | "amp": what the case ids and baselines say
    device_type: str

    @property
    def enabled(self) -> bool:
        return self.name == "amp"

    @property
    def dtype(self) -> str:
        if not self.enabled:
            return "float32"
        return "float16" if self.device_type == "cuda" else "bfloat16"

    @property
    def loss_scaling(self) -> bool:
        return self.enabled and self.device_type == "cuda"

    @property
    def label(self) -> str:
        return f"amp({self.dtype})" if self.enabled else "fp32"


PRECISIONS = ("fp32", "amp")
# The compiler axis, in words every framework shares (case ids line up across frameworks):
# "compiled" is torch.compile for torch, XLA (jit_compile=True) for TensorFlow.
COMPILERS = ("eager", "compiled")
