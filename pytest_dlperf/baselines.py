"""The baseline store: one JSON file per case and fingerprint, data only (no pickle, no eval),
written atomically under a file lock.

Layout: ``<root>/<test file's path from the rootdir, without .py>/<test>/<fingerprint id>.json``.
Schema version 2::

    {"schema_version": 2,
     "case": "perf_tests/test_resnet50_torch.py::test_resnet50_v15[1n2d-fp32]",
     "fingerprint": {...},                    # what the figures were measured on; see topology
     "metrics": {
       "samples_per_s":      {"median": 13.4, "repeats": [...], "higher_is_better": true,
                              "unit": "samples/s"},
       "scaling_efficiency": {...}            # multi-device cases only: speedup over 1n1d / devices
     },
     "tolerance": null,                       # optional per-baseline override of the run's tolerance
     "recorded": {"datetime": ..., "commit": ..., "dirty": ..., "environment": {...},
                  "protocol": {...}}}

Every metric keeps every repeat (one figure per timed window): the verdict compares samples, not
just medians. Version 1 (flat ``median``/``repeats``/``efficiency`` fields) is migrated on read.
A file that cannot be used (not JSON, truncated, a newer schema, wrong types) raises
``BaselineError`` naming the file and the problem; it is only ever replaced by an explicit update,
which keeps it beside the new one as ``<name>.bak``.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .jsonio import write_json_atomic
from .topology import fingerprint_id

SCHEMA_VERSION = 2
THROUGHPUT = "samples_per_s"
EFFICIENCY = "scaling_efficiency"
LOCK_NAME = ".dlperf.lock"
LOCK_TIMEOUT_S = 120.0


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and the problem."""


@dataclass
class Metric:
    repeats: list[float]
    median: float
    higher_is_better: bool = True
    unit: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"median": self.median, "repeats": self.repeats,
                "higher_is_better": self.higher_is_better, "unit": self.unit}


@dataclass
class Baseline:
    case: str
    fingerprint: dict[str, Any]
    metrics: dict[str, Metric]
    tolerance: float | None = None
    recorded: dict[str, Any] = field(default_factory=dict)
    # The schema version the file was read from (None: built here). Not written.
    read_schema: int | None = field(default=None, compare=False)

    @property
    def throughput(self) -> Metric:
        return self.metrics[THROUGHPUT]

    @property
    def efficiency(self) -> Metric | None:
        return self.metrics.get(EFFICIENCY)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "case": self.case,
            "fingerprint": self.fingerprint,
            "metrics": {name: metric.to_json() for name, metric in self.metrics.items()},
            "tolerance": self.tolerance,
            "recorded": self.recorded,
        }


def _require(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise BaselineError(f"baseline file {path}: {what}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _v1_to_v2(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Version 1 kept the throughput flat and the efficiency as one figure."""
    _require(_is_number(data.get("median")), path, "'median' must be a number (schema 1)")
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


MIGRATIONS: dict[int, Callable[[dict[str, Any], Path], dict[str, Any]]] = {1: _v1_to_v2}


def _metric(name: str, data: Any, path: Path) -> Metric:
    where = f"metrics.{name}"
    _require(isinstance(data, dict), path, f"'{where}' must be an object")
    repeats = data.get("repeats")
    _require(isinstance(repeats, list) and bool(repeats)
             and all(_is_number(v) and v > 0 for v in repeats), path,
             f"'{where}.repeats' must be a non-empty list of positive numbers")
    _require(_is_number(data.get("median")) and data["median"] > 0, path,
             f"'{where}.median' must be a positive number")
    _require(isinstance(data.get("higher_is_better", True), bool), path,
             f"'{where}.higher_is_better' must be true or false")
    _require(isinstance(data.get("unit", ""), str), path, f"'{where}.unit' must be a string")
    return Metric(repeats=[float(v) for v in repeats], median=float(data["median"]),
                  higher_is_better=data.get("higher_is_better", True), unit=data.get("unit", ""))


def parse(data: Any, path: Path) -> Baseline:
    """Validate a decoded baseline file, migrating older schemas; every problem names the file."""
    _require(isinstance(data, dict), path, f"expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    _require(_is_number(version) and int(version) == version and version >= 1, path,
             "missing or invalid 'schema_version' (expected an integer >= 1)")
    _require(version <= SCHEMA_VERSION, path,
             f"schema_version {version} is newer than this pytest-dlperf understands "
             f"({SCHEMA_VERSION}); upgrade pytest-dlperf, or rerun with "
             "--dlperf-update-baselines to replace it (the file is kept as .bak)")
    read_schema = int(version)
    while data["schema_version"] < SCHEMA_VERSION:
        data = MIGRATIONS[data["schema_version"]](data, path)
    _require(isinstance(data.get("case"), str), path, "'case' must be a string")
    _require(isinstance(data.get("fingerprint"), dict), path, "'fingerprint' must be an object")
    metrics = data.get("metrics")
    _require(isinstance(metrics, dict) and THROUGHPUT in metrics, path,
             f"'metrics' must be an object with a '{THROUGHPUT}' entry")
    tolerance = data.get("tolerance")
    _require(tolerance is None or (_is_number(tolerance) and 0 <= tolerance < 1), path,
             "'tolerance' must be null or a number in [0, 1)")
    recorded = data.get("recorded", {})
    _require(isinstance(recorded, dict), path, "'recorded' must be an object")
    return Baseline(
        case=data["case"], fingerprint=data["fingerprint"],
        metrics={name: _metric(name, value, path) for name, value in metrics.items()},
        tolerance=None if tolerance is None else float(tolerance), recorded=recorded,
        read_schema=read_schema)


def read(path: Path) -> Baseline:
    """Read and validate one baseline file."""
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
        # The parser ran out of text (mid-string or past the last character): cut off, most
        # likely by a write that did not finish (which atomic writes prevent) or a bad copy.
        truncated = bool(text.strip()) and (exc.pos >= len(text.rstrip())
                                            or exc.msg.startswith("Unterminated string"))
        problem = "truncated (it ends mid-document)" if truncated else "not valid JSON"
        raise BaselineError(f"baseline file {path}: {problem} ({exc}); fix it, delete it, or "
                            "rerun with --dlperf-update-baselines (the file is kept as .bak)"
                            ) from exc
    return parse(data, path)


def case_dirname(case: str) -> str:
    """``perf/test_x.py::test_y[1n2d-fp32]`` -> ``perf/test_x/test_y-1n2d-fp32``: shell- and
    diff-friendly. The test file's folders are kept (``a/test_x.py`` and ``b/test_x.py`` are
    different cases); a ``..`` (a test file outside the rootdir) becomes ``_up``."""
    module, _, name = case.partition("::")
    folders = [part for part in module.replace("\\", "/").split("/") if part not in ("", ".")]
    folders = ["_up" if part == ".." else re.sub(r"[^A-Za-z0-9_.-]+", "-", part)
               for part in folders]
    if folders:
        folders[-1] = re.sub(r"\.py$", "", folders[-1])
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")
    return "/".join(folders + ([name] if name else []))


@dataclass
class Change:
    """What an update did to one baseline file, for the reviewer's printout."""

    path: Path
    action: str  # "recorded" | "updated" | "replaced-unreadable" | "kept"
    new: Baseline
    old: Baseline | None = None
    problem: str | None = None  # why the old file was unreadable
    migrated_from: Path | None = None  # a schema-1 file of the case, replaced by ``path``

    @property
    def backup(self) -> Path | None:
        return self.path.with_name(self.path.name + ".bak") if self.problem else None


def legacy_fingerprint(fingerprint: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Schema 1 put the repeat count in the fingerprint's protocol ("w5-s10-r5"). It is a sample
    size, not a measurement condition: schema 2 leaves it out ("w5-s10"), so that a baseline
    recorded with more repeats, or a run grown by extra repeats, still compares."""
    return {**fingerprint, "protocol": f"{fingerprint['protocol']}-r{repeats}"}


class BaselineStore:
    def __init__(self, root: Path, repeats: int | None = None) -> None:
        self.root = root
        # The session's repeats: where to look for a schema-1 file of the same case.
        self.repeats = repeats

    def path_for(self, case: str, fingerprint: dict[str, Any]) -> Path:
        return self.root / case_dirname(case) / f"{fingerprint_id(fingerprint)}.json"

    def _legacy(self, case: str, fingerprint: dict[str, Any],
                aliases: Sequence[tuple[str, dict[str, Any]]]) -> tuple[Path, dict[str, Any]] | None:
        """The first existing file that older versions would have written for this baseline:
        under an alias (an older case key or fingerprint, as the caller knows them), or with
        schema 1's repeat count in the fingerprint. Returns its path and the fingerprint it
        must hold."""
        keys = [(case, fingerprint), *aliases]
        candidates = list(aliases)
        if self.repeats is not None and "protocol" in fingerprint:
            candidates += [(c, legacy_fingerprint(f, self.repeats)) for c, f in keys]
        for old_case, old_fp in candidates:
            path = self.path_for(old_case, old_fp)
            if path.exists():
                return path, old_fp
        return None

    def load(self, case: str, fingerprint: dict[str, Any],
             aliases: Sequence[tuple[str, dict[str, Any]]] = ()) -> Baseline | None:
        """The baseline of ``case`` on ``fingerprint``; a file of it filed under an alias or
        schema 1 is migrated on read; None if there is none."""
        path = self.path_for(case, fingerprint)
        expected = fingerprint
        if not path.exists():
            legacy = self._legacy(case, fingerprint, aliases)
            if legacy is None:
                return None
            path, expected = legacy
        baseline = read(path)
        _require(baseline.fingerprint == expected, path,
                 "its fingerprint does not match its file name (edited by hand?)")
        baseline.case, baseline.fingerprint = case, fingerprint
        return baseline

    def update(self, baseline: Baseline, *, only_missing: bool = False,
               aliases: Sequence[tuple[str, dict[str, Any]]] = ()) -> Change:
        """Write ``baseline``, under the store's lock so that two runs updating at once
        serialize: each reads the file the other wrote, nothing is torn and no update is lost.
        A per-baseline tolerance is carried over from the file replaced; an unreadable file is
        kept as ``.bak``; with ``only_missing`` an existing file is left alone."""
        from filelock import FileLock, Timeout

        path = self.path_for(baseline.case, baseline.fingerprint)
        self.root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.root / LOCK_NAME), timeout=LOCK_TIMEOUT_S)
        try:
            with lock:
                return self._update_locked(path, baseline, only_missing, aliases)
        except Timeout:
            raise BaselineError(
                f"baseline file {path}: another run has held the lock {lock.lock_file} for "
                f"{LOCK_TIMEOUT_S:.0f} s; if no other pytest-dlperf run is updating baselines, "
                "delete the lock file and rerun") from None

    def _update_locked(self, path: Path, baseline: Baseline, only_missing: bool,
                       aliases: Sequence[tuple[str, dict[str, Any]]]) -> Change:
        old: Baseline | None = None
        problem: str | None = None
        found = (None if path.exists()
                 else self._legacy(baseline.case, baseline.fingerprint, aliases))
        legacy = found[0] if found else None
        current = path if legacy is None else legacy
        if current.exists():
            if only_missing:
                return Change(path, "kept", baseline)
            try:
                old = read(current)
            except BaselineError as exc:
                problem = str(exc)
                shutil.copy2(current, path.with_name(path.name + ".bak"))  # keep what we replace
        if old is not None and baseline.tolerance is None:
            baseline.tolerance = old.tolerance
        write_json_atomic(path, baseline.to_json())
        if legacy is not None:
            legacy.unlink()  # superseded by the file just written: its figures are in `old`
            _remove_empty_parents(legacy.parent, self.root)
        action = "replaced-unreadable" if problem else ("updated" if old else "recorded")
        return Change(path, action, baseline, old, problem, migrated_from=legacy)

    def save(self, baseline: Baseline) -> Path:
        return self.update(baseline).path


def _remove_empty_parents(folder: Path, root: Path) -> None:
    """A migrated case leaves its old folders empty: remove them, up to the store's root."""
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:  # not empty
            return
        folder = folder.parent
