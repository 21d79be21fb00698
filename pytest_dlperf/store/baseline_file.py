"""One baseline file: its schema (version 3, described in ``store.baselines``), the records it
holds (``Baseline``, ``Metric``, ``Run``), and reading it, migrating versions 1 and 2 on the way.
A file that cannot be used raises ``BaselineError`` naming the file and the problem."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.protocol import median_of_launches

SCHEMA_VERSION = 3
THROUGHPUT = "samples_per_s"
EFFICIENCY = "scaling_efficiency"
MEMORY = "peak_memory_bytes"


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and the problem."""


@dataclass
class Metric:
    launches: list[list[float]]  # every window's figure, grouped by launch, oldest first
    median: float
    higher_is_better: bool = True
    unit: str = ""

    @property
    def repeats(self) -> list[float]:
        """Every window's figure."""
        return [value for launch in self.launches for value in launch]

    def to_json(self) -> dict[str, Any]:
        return {"median": self.median, "launches": self.launches,
                "higher_is_better": self.higher_is_better, "unit": self.unit}


@dataclass
class Run:
    """One recorded run (a pytest session) and how many of the baseline's launches it gave."""

    datetime: str | None
    commit: str | None
    dirty: bool | None
    launches: int

    def to_json(self) -> dict[str, Any]:
        return {"datetime": self.datetime, "commit": self.commit, "dirty": self.dirty,
                "launches": self.launches}


@dataclass
class Baseline:
    case: str
    fingerprint: dict[str, Any]
    metrics: dict[str, Metric]
    tolerance: float | None = None
    recorded: dict[str, Any] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    # The schema version the file was read from (None: built here). Not written.
    read_schema: int | None = field(default=None, compare=False)

    @property
    def throughput(self) -> Metric:
        return self.metrics[THROUGHPUT]

    @property
    def efficiency(self) -> Metric | None:
        return self.metrics.get(EFFICIENCY)

    @property
    def memory(self) -> Metric | None:
        return self.metrics.get(MEMORY)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "case": self.case,
            "fingerprint": self.fingerprint,
            "metrics": {name: metric.to_json() for name, metric in self.metrics.items()},
            "runs": [run.to_json() for run in self.runs],
            "tolerance": self.tolerance,
            "recorded": self.recorded,
        }

    @property
    def launch_count(self) -> int:
        return len(self.throughput.launches)

    def added(self, newer: Baseline, keep: int) -> Baseline:
        """This baseline's launches followed by ``newer``'s, the newest ``keep`` kept (every
        metric alike). Where the two do not hold the same throughput metrics (a scaling
        efficiency that one side lacks), the histories cannot be lined up launch by launch:
        ``newer`` starts afresh. Peak memory, which older baselines lack, starts with the first
        run that measured it; a run without it keeps the baseline's."""
        timing = {THROUGHPUT, EFFICIENCY}
        if set(self.metrics) & timing != set(newer.metrics) & timing:
            return newer
        metrics = {}
        for name, metric in newer.metrics.items():
            old = self.metrics.get(name)
            launches = ((old.launches if old else []) + metric.launches)[-keep:]
            metrics[name] = Metric(launches, median_of_launches(launches),
                                   metric.higher_is_better, metric.unit)
        for name, metric in self.metrics.items():
            metrics.setdefault(name, metric)
        runs = _trim_runs(self.runs + newer.runs, len(metrics[THROUGHPUT].launches))
        return Baseline(newer.case, newer.fingerprint, metrics, newer.tolerance,
                        newer.recorded, runs)


def _trim_runs(runs: list[Run], launches: int) -> list[Run]:
    """The newest runs covering the newest ``launches`` launches (the oldest kept run may have
    lost some of its launches)."""
    kept: list[Run] = []
    left = launches
    for run in reversed(runs):
        if left <= 0:
            break
        kept.append(Run(run.datetime, run.commit, run.dirty, min(run.launches, left)))
        left -= run.launches
    return kept[::-1]


def require(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise BaselineError(f"baseline file {path}: {what}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _v1_to_v2(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Version 1 kept the throughput flat and the efficiency as one figure."""
    require(_is_number(data.get("median")), path, "'median' must be a number (schema 1)")
    out = {k: v for k, v in data.items()
           if k not in ("median", "repeats", "efficiency", "metric", "higher_is_better")}
    out["metrics"] = {THROUGHPUT: {
        "median": data["median"], "repeats": data.get("repeats"),
        "higher_is_better": data.get("higher_is_better", True), "unit": "samples/s"}}
    if data.get("efficiency") is not None:
        # One figure: the verdict treats it as a single sample (its noise is unknown).
        out["metrics"][EFFICIENCY] = {"median": data["efficiency"],
                                      "repeats": [data["efficiency"]],
                                      "higher_is_better": True, "unit": "fraction"}
    out["schema_version"] = 2
    return out


def _v2_to_v3(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Version 2 kept each metric's windows as one flat ``repeats`` list, all from one launch
    (extra repeats were further launches, not told apart: one launch is the honest reading)."""
    metrics = data.get("metrics")
    if not isinstance(metrics, dict):
        raise BaselineError(f"baseline file {path}: 'metrics' must be an object (schema 2)")
    out = dict(data)
    out["metrics"] = {}
    for name, metric in metrics.items():
        require(isinstance(metric, dict), path, f"'metrics.{name}' must be an object")
        metric = dict(metric)
        repeats = metric.pop("repeats", None)
        metric["launches"] = [repeats] if isinstance(repeats, list) else repeats
        out["metrics"][name] = metric
    recorded: dict[str, Any] = data["recorded"] if isinstance(data.get("recorded"), dict) else {}
    out["runs"] = [{"datetime": recorded.get("datetime"), "commit": recorded.get("commit"),
                    "dirty": recorded.get("dirty"), "launches": 1}]
    out["schema_version"] = 3
    return out


MIGRATIONS: dict[int, Callable[[dict[str, Any], Path], dict[str, Any]]] = {1: _v1_to_v2,
                                                                         2: _v2_to_v3}


def _metric(name: str, data: Any, path: Path) -> Metric:
    where = f"metrics.{name}"
    require(isinstance(data, dict), path, f"'{where}' must be an object")
    launches = data.get("launches")
    require(isinstance(launches, list) and bool(launches) and all(
        isinstance(launch, list) and bool(launch) and all(_is_number(v) and v > 0 for v in launch)
        for launch in launches), path,
        f"'{where}.launches' must be a non-empty list of launches, each a non-empty list of "
        "positive numbers")
    require(_is_number(data.get("median")) and data["median"] > 0, path,
             f"'{where}.median' must be a positive number")
    require(isinstance(data.get("higher_is_better", True), bool), path,
             f"'{where}.higher_is_better' must be true or false")
    require(isinstance(data.get("unit", ""), str), path, f"'{where}.unit' must be a string")
    return Metric(launches=[[float(v) for v in launch] for launch in launches],
                  median=float(data["median"]),
                  higher_is_better=data.get("higher_is_better", True), unit=data.get("unit", ""))


def parse(data: Any, path: Path) -> Baseline:
    """Validate a decoded baseline file, migrating older schemas; every problem names the file."""
    require(isinstance(data, dict), path, f"expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    require(_is_number(version) and int(version) == version and version >= 1, path,
             "missing or invalid 'schema_version' (expected an integer >= 1)")
    require(version <= SCHEMA_VERSION, path,
             f"schema_version {version} is newer than this pytest-dlperf understands "
             f"({SCHEMA_VERSION}); upgrade pytest-dlperf, or rerun with "
             "--dlperf-update-baselines to replace it (the file is kept as .bak)")
    read_schema = int(version)
    while data["schema_version"] < SCHEMA_VERSION:
        data = MIGRATIONS[data["schema_version"]](data, path)
    require(isinstance(data.get("case"), str), path, "'case' must be a string")
    require(isinstance(data.get("fingerprint"), dict), path, "'fingerprint' must be an object")
    metrics = data.get("metrics")
    require(isinstance(metrics, dict) and THROUGHPUT in metrics, path,
             f"'metrics' must be an object with a '{THROUGHPUT}' entry")
    tolerance = data.get("tolerance")
    require(tolerance is None or (_is_number(tolerance) and 0 <= tolerance < 1), path,
             "'tolerance' must be null or a number in [0, 1)")
    recorded = data.get("recorded", {})
    require(isinstance(recorded, dict), path, "'recorded' must be an object")
    # Throughput first: a file wrong everywhere is named by its main figure.
    order = sorted(metrics, key=lambda name: (name != THROUGHPUT, name != EFFICIENCY, name))
    parsed = {name: _metric(name, metrics[name], path) for name in order}
    # Throughput and scaling efficiency are measured together, launch by launch; peak memory
    # may cover fewer (the newest) launches: older baselines had none.
    counts = {name: len(metric.launches) for name, metric in parsed.items() if name != MEMORY}
    require(len(set(counts.values())) == 1, path,
             f"every metric must hold the same launches, got {counts}")
    return Baseline(
        case=data["case"], fingerprint=data["fingerprint"], metrics=parsed,
        tolerance=None if tolerance is None else float(tolerance), recorded=recorded,
        runs=_runs(data.get("runs", []), path), read_schema=read_schema)


def _runs(data: Any, path: Path) -> list[Run]:
    require(isinstance(data, list), path, "'runs' must be a list")
    runs = []
    for i, run in enumerate(data):
        require(isinstance(run, dict), path, f"'runs[{i}]' must be an object")
        count = run.get("launches")
        require(isinstance(count, int) and not isinstance(count, bool) and count >= 1, path,
                 f"'runs[{i}].launches' must be an integer >= 1")
        runs.append(Run(run.get("datetime"), run.get("commit"), run.get("dirty"), count))
    return runs


def read(path: Path) -> Baseline:
    """Read and validate one baseline file."""
    if path.is_dir():
        raise BaselineError(f"baseline file {path}: is a folder, not a file; move it away (it "
                            "is where this case's baseline file goes) and rerun")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise BaselineError(f"baseline file {path}: cannot be read ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise BaselineError(f"baseline file {path}: not UTF-8 text ({exc}); delete it, or rerun "
                            "with --dlperf-update-baselines (the file is kept as .bak)") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # The parser ran out of text (mid-string, past the last character, or in a number cut
        # inside its exponent, where it stops before the "e"): cut off, most likely by a write
        # that did not finish (which atomic writes prevent) or a bad copy.
        rest = text.rstrip()[exc.pos:]
        cut_number = bool(rest) and set(rest) <= set("0123456789.eE+-")
        truncated = bool(text.strip()) and (exc.pos >= len(text.rstrip()) or cut_number
                                            or exc.msg.startswith("Unterminated string"))
        problem = "truncated (it ends mid-document)" if truncated else "not valid JSON"
        raise BaselineError(f"baseline file {path}: {problem} ({exc}); fix it, delete it, or "
                            "rerun with --dlperf-update-baselines (the file is kept as .bak)"
                            ) from exc
    return parse(data, path)
