"""Model FLOPs utilization: the devices' dense peaks, the precision a case's math ran in, and the
record of a workload's FLOPs per sample (counted in ``rank.flops``).

MFU = achieved FLOP/s per device / the device's dense peak for the precision the math ran in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Dense peaks (no 2:4 sparsity), FLOP/s, by precision of the math. Sources: NVIDIA's datasheets
# (the sparsity figures halved): "NVIDIA H100 Tensor Core GPU" datasheet (SXM5 / PCIe / NVL), the
# H200 datasheet (same compute as H100 SXM), "NVIDIA A100 Tensor Core GPU" datasheet (SXM4 and
# PCIe alike), "NVIDIA Tesla V100" datasheet (SXM2 / PCIe). Matched against NVML's device name,
# first pattern that the name contains wins.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378e12, "fp32": 51e12}),
    ("H100 NVL", {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    ("H100", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("H200", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("V100-PCIE", {"fp16": 112e12, "fp32": 14e12}),
    ("V100", {"fp16": 125e12, "fp32": 15.7e12}),
)
_DTYPE_PRECISION = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


@dataclass(frozen=True)
class Peak:
    device: str  # the device name it was found for, or "--dlperf-peak-flops"
    precision: str  # "bf16" | "fp16" | "tf32" | "fp32"
    flops_per_s: float

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "precision": self.precision,
                "flops_per_s": self.flops_per_s}


def math_precision(amp_dtype: str, environment: dict[str, Any]) -> str:
    """The precision the case's matrix math ran in: the AMP dtype; in an fp32 case TF32 where
    the framework let it into its matrix products or convolutions (``environment["tf32"]``,
    which the CUDA adapters report)."""
    precision = _DTYPE_PRECISION.get(amp_dtype, "fp32")
    if precision == "fp32" and environment.get("tf32"):
        return "tf32"
    return precision


def peak_for(device_name: str | None, precision: str,
             override: float | None = None) -> Peak | None:
    """The dense peak of ``device_name`` (NVML's name) at ``precision``; ``override`` (the
    user's ``--dlperf-peak-flops``) wins. None: not known (every CPU, an unlisted GPU, a
    precision the device lacks)."""
    if override is not None:
        return Peak("--dlperf-peak-flops", precision, override)
    if not device_name:
        return None
    for pattern, peaks in PEAK_FLOPS:
        if pattern.lower() in device_name.lower():
            value = peaks.get(precision)
            return Peak(device_name, precision, value) if value is not None else None
    return None


@dataclass(frozen=True)
class FlopsCount:
    """A workload's FLOPs per trained sample, or why there is none."""

    per_sample: float | None
    source: str  # "FlopCounterMode (meta)", "FlopCounterMode (cpu, batch 1)", "workload", ...
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"flops_per_sample": self.per_sample, "source": self.source,
                "problem": self.problem}
