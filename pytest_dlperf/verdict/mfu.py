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
# first pattern that the name contains wins. H100 SXM's bf16 is 989.4 T: the 1,979 T of the
# datasheet's headline is with 2:4 sparsity, and a dense MFU against it reads half (torchtitan
# #1393 made that mistake with B200's); TF32 is half of bf16, so a bf16 case measured against it
# reads double (torchtitan #668), which is why the peak follows the precision the math ran in.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378e12, "fp32": 51e12}),
    ("H100 NVL", {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    ("H100", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("H200 NVL", {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    ("H200", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("V100-PCIE", {"fp16": 112e12, "fp32": 14e12}),
    ("V100", {"fp16": 125e12, "fp32": 15.7e12}),
)
_DTYPE_PRECISION = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


OVERRIDE = "--dlperf-peak-flops"
# A CPU's peak where none is given: a dense GEMM's rate measured on it (``rank.gemm``).
MEASURED = "measured GEMM"


@dataclass(frozen=True)
class Peak:
    device: str  # the device name it was found for, "--dlperf-peak-flops" or MEASURED
    precision: str  # "bf16" | "fp16" | "tf32" | "fp32"
    flops_per_s: float  # a device's (a CPU rank's: per_core x cores)
    # On a CPU the peak belongs to a core: a rank's is a core's times the threads it computes
    # with (a 1n1d rank on two cores has twice a 1n2d rank's).
    per_core: float | None = None
    cores: int | None = None
    measured: str | None = None  # MEASURED's: how (the library, the matrices, the date)

    @property
    def source(self) -> str:
        """Where the figure came from, in words a user can act on."""
        per_rank = (f" ({self.per_core:.4g} FLOP/s a core x {self.cores} thread(s) a rank)"
                    if self.per_core is not None else "")
        if self.device == OVERRIDE:
            return OVERRIDE + per_rank
        if self.device == MEASURED:
            return (f"a dense GEMM measured on this CPU ({self.measured}){per_rank}, a rate "
                    f"of its math library, not the hardware's peak")
        return (f"pytest-dlperf's table of dense peaks (pytest_dlperf.verdict.mfu.PEAK_FLOPS) "
                f"for {self.device!r}")

    def to_json(self) -> dict[str, Any]:
        extra = ({} if self.per_core is None else
                 {"per_core_flops_per_s": self.per_core, "cores": self.cores,
                  "measured": self.measured})
        return {"device": self.device, "precision": self.precision,
                "flops_per_s": self.flops_per_s, **extra}



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
        return Peak(OVERRIDE, precision, override)
    if not device_name:
        return None
    for pattern, peaks in PEAK_FLOPS:
        if pattern.lower() in device_name.lower():
            value = peaks.get(precision)
            return Peak(device_name, precision, value) if value is not None else None
    return None


def cpu_peak(precision: str, threads: int, override: float | None,
             measured: dict[str, Any] | None) -> Peak | None:
    """A CPU rank's peak at ``precision``: ``override`` (``--dlperf-peak-flops``, a core's on a
    CPU) or the measured GEMM rate of a core (``measured``: ``rank.gemm``'s), times the
    ``threads`` the rank computes with. None: neither (the measurement lacks the precision)."""
    threads = max(1, threads)
    if override is not None:
        return Peak(OVERRIDE, precision, override * threads, override, threads)
    rate = (measured or {}).get(precision)
    if not rate:
        return None
    assert measured is not None
    how = (f"{measured.get('library')}, {measured.get('n')}x{measured.get('n')} matrices, "
           f"one thread, {measured.get('date', 'this session')}")
    return Peak(MEASURED, precision, float(rate) * threads, float(rate), threads, how)


@dataclass(frozen=True)
class FlopsCount:
    """A workload's FLOPs per trained sample, or why there is none."""

    per_sample: float | None
    source: str  # "FlopCounterMode (meta)", "FlopCounterMode (cpu, batch 1)", "workload", ...
    problem: str | None = None
    # Units (tokens) a sample holds, and their name: throughput is in units/s ("tokens/s"), so
    # the FLOPs a unit takes are what multiplies it.
    units_per_sample: int = 1
    unit: str = "samples"

    @property
    def per_unit(self) -> float | None:
        """FLOPs of one unit of the throughput (a token of a language model, else a sample)."""
        return None if self.per_sample is None else self.per_sample / self.units_per_sample

    def to_json(self) -> dict[str, Any]:
        return {"flops_per_sample": self.per_sample, "source": self.source,
                "problem": self.problem, "units_per_sample": self.units_per_sample,
                "unit": self.unit}


class ImpossibleMFU(ValueError):
    """An MFU above 100%: no device computes above its peak, so the peak (or the FLOPs per
    sample) is wrong, and the figure is refused rather than shown."""


def model_flops_utilization(achieved_flops_per_s: float, peak: Peak, flops: FlopsCount,
                            per_device_rate: float) -> float:
    """Achieved FLOP/s per device over the peak; an ``ImpossibleMFU`` naming the peak, its
    source and precision where that is above 1 (torchtitan users were shown 152% and 563%)."""
    mfu = achieved_flops_per_s / peak.flops_per_s
    if mfu <= 1.0 or peak.device == MEASURED:  # a measured rate is no ceiling: shown as it is
        return mfu
    unit = flops.unit
    per = unit[:-1] if unit.endswith("s") else unit
    raise ImpossibleMFU(
        f"MFU {mfu:.1%} is above 100%: {achieved_flops_per_s:.4g} FLOP/s per device achieved "
        f"({flops.per_unit:.4g} FLOP per {per} ({flops.source}) x {per_device_rate:,.2f} "
        f"{unit}/s per device) against a peak of {peak.flops_per_s:.4g} FLOP/s at "
        f"{peak.precision} from {peak.source}. No device computes above its dense peak, so "
        f"the peak is wrong for this device and precision (a sparsity figure, another card's, "
        f"the TF32 figure for {peak.precision} math?) or the workload's FLOPs per sample are: "
        f"give {'a core' if peak.per_core is not None else 'the device'}'s dense "
        f"{peak.precision} peak with {OVERRIDE}")
