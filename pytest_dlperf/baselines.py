"""The baseline store: one JSON file per case and fingerprint, data only, written atomically.

Layout: ``<root>/<case>/<fingerprint id>.json``. A file holds::

    {"schema_version": 1, "case": ..., "fingerprint": {...}, "metric": "samples_per_s",
     "higher_is_better": true, "median": ..., "repeats": [...], "tolerance": null | float,
     "efficiency": null | float,
     "recorded": {"datetime": ..., "commit": ..., "environment": {...}}}

``tolerance`` is an optional per-baseline override of the run's tolerance; ``efficiency`` (optional)
is the scaling efficiency of a multi-device case (speedup over 1n1d / devices).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .jsonio import write_json_atomic
from .topology import fingerprint_id

SCHEMA_VERSION = 1


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and the problem."""


@dataclass
class Baseline:
    case: str
    fingerprint: dict[str, Any]
    repeats: list[float]
    median: float
    tolerance: float | None = None
    recorded: dict[str, Any] = field(default_factory=dict)
    metric: str = "samples_per_s"
    higher_is_better: bool = True
    # Scaling efficiency (speedup over 1n1d / devices) of a multi-device case; higher is better.
    efficiency: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "case": self.case,
            "fingerprint": self.fingerprint,
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "median": self.median,
            "repeats": self.repeats,
            "tolerance": self.tolerance,
            "recorded": self.recorded,
            "efficiency": self.efficiency,
        }


def _require(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise BaselineError(f"baseline file {path}: {what}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse(data: Any, path: Path) -> Baseline:
    """Validate a decoded baseline file; every problem names the file."""
    _require(isinstance(data, dict), path, f"expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    _require(isinstance(version, int), path, "missing or non-integer 'schema_version'")
    _require(version <= SCHEMA_VERSION, path,
             f"schema_version {version} is newer than this pytest-dlperf understands "
             f"({SCHEMA_VERSION}); upgrade pytest-dlperf")
    _require(isinstance(data.get("case"), str), path, "'case' must be a string")
    _require(isinstance(data.get("fingerprint"), dict), path, "'fingerprint' must be an object")
    repeats = data.get("repeats")
    _require(isinstance(repeats, list) and bool(repeats) and all(_is_number(v) for v in repeats),
             path, "'repeats' must be a non-empty list of numbers")
    _require(_is_number(data.get("median")) and data["median"] > 0, path,
             "'median' must be a positive number")
    tolerance = data.get("tolerance")
    _require(tolerance is None or (_is_number(tolerance) and 0 <= tolerance < 1), path,
             "'tolerance' must be null or a number in [0, 1)")
    efficiency = data.get("efficiency")
    _require(efficiency is None or (_is_number(efficiency) and efficiency > 0), path,
             "'efficiency' must be null or a positive number")
    return Baseline(
        efficiency=None if efficiency is None else float(efficiency),
        case=data["case"], fingerprint=data["fingerprint"], repeats=[float(v) for v in repeats],
        median=float(data["median"]), tolerance=None if tolerance is None else float(tolerance),
        recorded=data.get("recorded", {}), metric=data.get("metric", "samples_per_s"),
        higher_is_better=bool(data.get("higher_is_better", True)),
    )


def case_dirname(case: str) -> str:
    """``test_x.py::test_y[1n2d-fp32]`` -> ``test_x/test_y-1n2d-fp32``: shell- and diff-friendly."""
    module, _, name = case.partition("::")
    module = re.sub(r"\.py$", "", module.replace("\\", "/").split("/")[-1])
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")
    return f"{module}/{name}" if name else module


class BaselineStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, case: str, fingerprint: dict[str, Any]) -> Path:
        return self.root / case_dirname(case) / f"{fingerprint_id(fingerprint)}.json"

    def load(self, case: str, fingerprint: dict[str, Any]) -> Baseline | None:
        path = self.path_for(case, fingerprint)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BaselineError(f"baseline file {path}: not valid JSON ({exc}); fix it, delete it, "
                                "or rerun with --dlperf-update-baselines") from exc
        baseline = parse(data, path)
        _require(baseline.fingerprint == fingerprint, path,
                 "its fingerprint does not match its file name (edited by hand?)")
        return baseline

    def save(self, baseline: Baseline) -> Path:
        path = self.path_for(baseline.case, baseline.fingerprint)
        if path.exists():
            try:
                parse(json.loads(path.read_text()), path)
            except (BaselineError, ValueError):
                shutil.copy2(path, path.with_name(path.name + ".bak"))  # keep what we replace
        write_json_atomic(path, baseline.to_json())
        return path
