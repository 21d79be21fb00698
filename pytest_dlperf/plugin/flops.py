"""FLOPs per sample on the pytest side: counted once per session and workload, in a subprocess
of pytest's interpreter (``python -m pytest_dlperf.rank.flops``), so torch is never imported in
pytest's own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..core.protocol import Protocol
from ..core.recipes import recipe_reference
from ..core.spec import RankSpec, spec_for
from ..core.workload import CaseWorkload, SizeValue, Workload, WorkloadError
from ..verdict.mfu import (
    FlopsCount,
    ImpossibleMFU,
    Peak,
    cpu_peak,
    math_precision,
    model_flops_utilization,
    peak_for,
)
from .outcome import fail
from .settings import host_identity


def count_in_subprocess(spec: RankSpec, work_dir: Path,
                        timeout_s: float = 600.0) -> FlopsCount:
    """Count the spec's FLOPs per sample in a subprocess of pytest's interpreter (torch is
    imported there, never in pytest's own process)."""
    if spec.recipe is None:
        return FlopsCount(None, "none", "the workload has no torch recipe to count FLOPs with "
                          "(give Workload(flops_per_sample=...) to state them)")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("CUDA_VISIBLE_DEVICES", "")  # meta and CPU only: no CUDA context
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=work_dir, delete=False) as fh:
        fh.write(spec.dumps())
    try:
        done = subprocess.run([sys.executable, "-m", "pytest_dlperf.rank.flops", fh.name],
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


def flops_key(workload: Workload, sized: CaseWorkload, device_type: str) -> str:
    """What a FLOP count depends on: the workload, its torch recipe, sizes and batch, and the
    device type; one count per key and session."""
    torch_recipe = workload.recipes.get("torch")
    reference = (None if torch_recipe is None else
                 recipe_reference(torch_recipe, f"workload {workload.name!r}, torch recipe"))
    stated: Any = workload.flops_per_sample
    if callable(stated):  # a formula: named by where it lives (its repr holds an address)
        stated = f"{getattr(stated, '__module__', '')}:{getattr(stated, '__qualname__', '')}"
    return json.dumps([workload.name, stated,
                       None if reference is None else asdict(reference),
                       dict(sized.sizes), sized.batch_size, device_type],
                      sort_keys=True, default=str)


def flops_per_sample(workload: Workload, sized: CaseWorkload, protocol: Protocol,
                     device_type: str, rank_flops: dict[str, Any] | None,
                     work_dir: Path) -> FlopsCount:
    """FLOPs per sample: the workload's own figure (or formula of its sizes), else what a torch
    rank counted, else counted in a subprocess with the workload's torch recipe; with the
    units a sample holds (throughput is in units/s)."""
    count = _flops_per_sample(workload, sized, protocol, device_type, rank_flops, work_dir)
    return replace(count, units_per_sample=sized.units_per_sample, unit=sized.unit)


def _flops_per_sample(workload: Workload, sized: CaseWorkload, protocol: Protocol,
                      device_type: str, rank_flops: dict[str, Any] | None,
                      work_dir: Path) -> FlopsCount:
    if workload.flops_per_sample is not None:
        return stated_flops(workload, sized.sizes)
    if rank_flops is not None:
        value = rank_flops.get("flops_per_sample")
        return FlopsCount(None if value is None else float(value), str(rank_flops["source"]),
                          rank_flops.get("problem") or rank_flops.get("meta_error"))
    try:
        reference = spec_for("torch", workload, protocol=protocol, device_type=device_type,
                             batch_size=sized.batch_size, sizes=dict(sized.sizes),
                             recipe_key="torch")
    except WorkloadError as exc:
        return FlopsCount(None, "none", str(exc))
    return count_in_subprocess(reference, work_dir)


def stated_flops(workload: Workload, sizes: Mapping[str, SizeValue]) -> FlopsCount:
    """The workload's own FLOPs per sample: its number, or its formula of the case's sizes;
    a formula that fails or returns no positive number is a problem reported, not raised
    (FLOPs are not what the case measures)."""
    stated = workload.flops_per_sample
    if not callable(stated):
        return FlopsCount(None if stated is None else float(stated), "workload")
    name = getattr(stated, "__qualname__", repr(stated))
    try:
        value = stated(dict(sizes))
    except Exception as exc:  # noqa: BLE001 - the user's formula
        return FlopsCount(None, "none", f"workload {workload.name!r}: flops_per_sample "
                          f"({name}) failed on sizes {dict(sizes)}: {type(exc).__name__}: {exc}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return FlopsCount(None, "none", f"workload {workload.name!r}: flops_per_sample ({name}) "
                          f"returned {value!r} for sizes {dict(sizes)}, not a positive number")
    return FlopsCount(float(value), "workload")


@dataclass(frozen=True)
class Utilization:
    """Achieved FLOP/s per device and, where the device's peak is known, MFU."""

    achieved_flops_per_s: float | None = None
    peak: Peak | None = None
    mfu: float | None = None
    missing: str | None = None  # why there is no MFU (the terminal and the results say it)


def utilization(flops: FlopsCount, per_device_rate: float, amp_dtype: str,
                environment: dict[str, Any], device_name: str | None,
                peak_override: float | None, *, device_type: str = "cuda", threads: int = 1,
                gemm: Callable[[], dict[str, Any] | None] = lambda: None) -> Utilization:
    """``per_device_rate`` is the throughput per device in the workload's units (tokens/s of a
    language model: the FLOPs of a unit multiply it). An MFU above a stated peak fails the case
    naming the peak, never shown as a figure. On a CPU the peak is a core's (the override's,
    else ``gemm()``'s measured rate) times the rank's ``threads``."""
    per_unit = flops.per_unit
    if per_unit is None:
        unused = (f"; --dlperf-peak-flops {peak_override:g} is not used without them"
                  if peak_override is not None else "")
        why = flops.problem or "not counted"
        return Utilization(missing=f"its FLOPs per sample are unknown ({why}){unused}")
    achieved = per_unit * per_device_rate
    precision = math_precision(amp_dtype, environment)
    if device_type == "cpu":
        peak = cpu_peak(precision, threads, peak_override,
                        None if peak_override is not None else gemm())
        if peak is None:
            return Utilization(achieved, missing=(
                f"no dense GEMM rate in {precision} could be measured on this CPU: give a "
                f"core's peak FLOP/s with --dlperf-peak-flops"))
    else:
        peak = peak_for(device_name, precision, peak_override)
    if peak is None:
        return Utilization(achieved, missing=f"the peak FLOP/s of {device_name or 'this CPU'} "
                           f"in {precision} is not known: give it with --dlperf-peak-flops")
    try:
        mfu = model_flops_utilization(achieved, peak, flops, per_device_rate)
    except ImpossibleMFU as exc:
        fail(f"pytest-dlperf: {exc}")
    return Utilization(achieved, peak, mfu)


def gemm_cache() -> Path:
    """Where a machine's measured GEMM rates are kept: the user's cache folder
    (``$XDG_CACHE_HOME``, else ``~/.cache``), so every project and session on the machine
    shares one measurement (``-p no:cacheprovider`` too)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "pytest-dlperf" / "cpu-gemm.json"


def measured_gemm(path: Path | None, computer: str, cpu_model: str,
                  timeout_s: float = 120.0) -> dict[str, Any] | None:
    """A core's dense GEMM rates on this machine (``rank.gemm``), from ``path`` (None: kept
    nowhere) where this ``computer`` (``host_identity``) and CPU measured them before, else
    measured now in a subprocess of pytest's interpreter and kept there. None where the
    measurement failed."""
    import datetime

    from ..core.jsonio import write_json_atomic

    key = f"{computer}|{cpu_model}"
    try:
        kept = json.loads(path.read_text()) if path is not None and path.exists() else {}
    except (OSError, ValueError):
        kept = {}  # unreadable: measured again and written anew
    if not isinstance(kept, dict):
        kept = {}
    if isinstance(kept.get(key), dict):
        return dict(kept[key])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run([sys.executable, "-m", "pytest_dlperf.rank.gemm"],
                              capture_output=True, text=True, timeout=timeout_s, env=env,
                              stdin=subprocess.DEVNULL)
        rates = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    rates["date"] = datetime.date.today().isoformat()
    if path is not None:
        try:
            write_json_atomic(path, {**kept, key: rates})
        except OSError:
            pass  # a read-only home: measured again next session
    return dict(rates)


def session_gemm(state: Any) -> dict[str, Any] | None:
    """A core's measured dense GEMM rates (MFU's peak on a CPU), once a session (``state``: the
    session's ``SessionState``, whose ``gemm`` keeps them), kept under the computer
    (``host_identity``), not the ``--dlperf-machine`` label: one computer's sessions under two
    labels, or on two local nodes (host names of their own), share one measurement."""
    kept: list[dict[str, Any] | None] = state.gemm
    if not kept:
        kept.append(measured_gemm(gemm_cache(), host_identity(), state.hardware.cpu_model))
    return kept[0]
