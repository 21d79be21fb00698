"""FLOPs per trained sample, achieved FLOP/s and model FLOPs utilization (MFU).

FLOPs are counted once per workload and size, by torch's ``FlopCounterMode`` over one forward
and backward step of the workload's torch recipe (the reference: the alignment tests guarantee
that every framework trains the same architecture, so a framework without a counter of its own
uses this figure). The count runs in a subprocess of pytest's interpreter
(``python -m pytest_dlperf.flops SPEC.json``) on torch's ``meta`` device, where no tensor holds
data and nothing is computed, so DLPerf's full sizes count in a second on any host; a recipe
that cannot run on ``meta`` (a data-dependent op) is counted on the CPU at batch 1 instead. A
workload may state its figure instead (``Workload(flops_per_sample=...)``), the only way for a
workload without a torch recipe.

``FlopCounterMode`` counts the matrix products and convolutions (2 FLOPs a multiply-add),
forward and backward, which is what MFU conventionally counts (PaLM's appendix B, Megatron):
elementwise work, normalization and the optimizer are left out.

MFU = achieved FLOP/s per device / the device's dense peak for the precision the math ran in.
"""

from __future__ import annotations

import json
import sys
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


# -- the counting subprocess -----------------------------------------------------------------

def _to(value: Any, device: str) -> Any:
    import torch

    if callable(value) and not isinstance(value, torch.nn.Module):
        value = value()
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _count_step(spec: Any, device: str) -> float:
    """FLOPs of one forward and backward step of the spec's torch recipe on ``device``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from .workload import load_recipe

    recipe = load_recipe(spec.recipe)
    ctx = spec.context(0, 1, 0, device)
    parts = recipe(ctx)
    model = parts.model.to(device)
    if parts.data is not None:
        inputs, targets = next(iter(parts.data))
    else:
        inputs, targets = parts.inputs, parts.targets
    inputs, targets = _to(inputs, device), _to(targets, device)
    criterion = parts.loss or torch.nn.functional.cross_entropy
    with FlopCounterMode(display=False) as counter:
        outputs = model(*inputs) if isinstance(inputs, tuple) else model(inputs)
        criterion(outputs, targets).backward()
    return float(counter.get_total_flops())


def count(spec: Any) -> dict[str, Any]:
    """FLOPs per sample of the spec's torch recipe: on ``meta`` at the case's batch, else on
    the CPU at batch 1."""
    try:
        total = _count_step(spec, "meta")
        return {"flops_per_sample": total / spec.batch_size, "source": "FlopCounterMode (meta)"}
    except Exception as meta_error:  # noqa: BLE001 - any op without a meta kernel
        single = spec.with_(batch_size=1, device_type="cpu")
        total = _count_step(single, "cpu")
        return {"flops_per_sample": total, "source": "FlopCounterMode (cpu, batch 1)",
                "meta_error": f"{type(meta_error).__name__}: {meta_error}"[:500]}


def count_in_rank(spec: Any) -> dict[str, Any]:
    """The count, in a torch rank before it builds its trainer (torch is imported there
    anyway); a failure is reported, never raised: FLOPs are not what the case measures."""
    try:
        return count(spec)
    except Exception as exc:  # noqa: BLE001
        return {"flops_per_sample": None, "source": "none",
                "problem": f"counting FLOPs failed: {type(exc).__name__}: {exc}"[:500]}


def main(argv: list[str]) -> int:
    from .spec import RankSpec

    if len(argv) != 1:
        print("usage: python -m pytest_dlperf.flops SPEC.json", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    with open(argv[0]) as fh:
        spec = RankSpec.from_json(json.load(fh))
    print(json.dumps(count(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# -- the pytest side -------------------------------------------------------------------------

def count_in_subprocess(spec: Any, work_dir: Any, timeout_s: float = 600.0) -> FlopsCount:
    """Count the spec's FLOPs per sample in a subprocess of pytest's interpreter (torch is
    imported there, never in pytest's own process)."""
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    if spec.recipe is None:
        return FlopsCount(None, "none", "the workload has no torch recipe to count FLOPs with "
                          "(give Workload(flops_per_sample=...) to state them)")
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("CUDA_VISIBLE_DEVICES", "")  # meta and CPU only: no CUDA context
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=work_dir, delete=False) as fh:
        fh.write(spec.dumps())
    try:
        done = subprocess.run([sys.executable, "-m", "pytest_dlperf.flops", fh.name],
                              capture_output=True, text=True, timeout=timeout_s, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return FlopsCount(None, "none", f"counting FLOPs took over {timeout_s:g} s")
    finally:
        os.unlink(fh.name)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return FlopsCount(None, "none", f"counting FLOPs with the torch recipe failed: {tail}")
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return FlopsCount(None, "none", f"the FLOP counter printed no result: {done.stdout!r}")
    return FlopsCount(float(data["flops_per_sample"]), str(data["source"]),
                      data.get("meta_error"))


def parse_flops(raw: str) -> float:
    """A FLOP/s figure: a number, optionally with a k/M/G/T/P suffix (989.4T)."""
    text = str(raw).strip()
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}.get(text[-1:].lower(), 1.0)
    number = text[:-1] if scale != 1.0 else text
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError("expected FLOP/s as a number, optionally with a k/M/G/T/P suffix "
                         "(989.4T)") from None
    if not value > 0:
        raise ValueError(f"expected a positive FLOP/s figure, got {raw!r}")
    return value
