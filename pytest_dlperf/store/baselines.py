"""The baseline store: one JSON file per machine, case and fingerprint, data only (no pickle, no
eval), written atomically under a file lock.

Layout: ``<root>/<machine>/<test file's path from the rootdir, without .py>/<test>/<fingerprint
id>.json``. A baseline belongs to the machine it was recorded on (``--dlperf-machine``): figures
of one host never judge another, even of the same model and fingerprint. Schema version 3::

    {"schema_version": 3,
     "case": "perf_tests/test_resnet50_torch.py::test_resnet50_v15[1n2d-fp32]",
     "fingerprint": {..., "machine": "gpu-runner-7"},  # what the figures were measured on
     "metrics": {
       "samples_per_s":      {"median": 13.4, "launches": [[...], [...]],
                              "higher_is_better": true, "unit": "samples/s"},
       "scaling_efficiency": {...},           # multi-device cases only: speedup over 1n1d / devices
       "peak_memory_bytes":  {..., "higher_is_better": false, "unit": "bytes"}
                                              # each window's peak over the ranks
     },
     "runs": [{"datetime": ..., "commit": ..., "dirty": ..., "launches": 2}, ...],
     "tolerance": null,                       # optional per-baseline override of the run's tolerance
     "recorded": {"datetime": ..., "commit": ..., "dirty": ..., "environment": {...},
                  "protocol": {...}}}

Every metric keeps every window, grouped by launch (a launch: one start of the case's
processes): the verdict compares launches, so the baseline knows its own between-run spread.
``runs`` says which recorded runs (pytest sessions) the launches came from, oldest first; an
update with ``add`` appends this run's launches and keeps the newest ``keep`` of them. Older
schemas are migrated on read: version 1 (flat ``median``/``repeats``/``efficiency`` fields) and
version 2 (``repeats``: every window of one launch). A file that cannot be used (not JSON,
truncated, a newer schema, wrong types) raises ``BaselineError`` naming the file and the
problem; it is only ever replaced by an explicit update, which keeps it beside the new one as
``<name>.bak``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..core.jsonio import write_json_atomic
from ..core.protocol import median_of_launches
from ..core.topology import fingerprint_id

SCHEMA_VERSION = 3
THROUGHPUT = "samples_per_s"
EFFICIENCY = "scaling_efficiency"
MEMORY = "peak_memory_bytes"
LOCK_NAME = ".dlperf.lock"
LOCK_TIMEOUT_S = 120.0


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


def _v2_to_v3(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Version 2 kept each metric's windows as one flat ``repeats`` list, all from one launch
    (extra repeats were further launches, not told apart: one launch is the honest reading)."""
    metrics = data.get("metrics")
    if not isinstance(metrics, dict):
        raise BaselineError(f"baseline file {path}: 'metrics' must be an object (schema 2)")
    out = dict(data)
    out["metrics"] = {}
    for name, metric in metrics.items():
        _require(isinstance(metric, dict), path, f"'metrics.{name}' must be an object")
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
    _require(isinstance(data, dict), path, f"'{where}' must be an object")
    launches = data.get("launches")
    _require(isinstance(launches, list) and bool(launches) and all(
        isinstance(launch, list) and bool(launch) and all(_is_number(v) and v > 0 for v in launch)
        for launch in launches), path,
        f"'{where}.launches' must be a non-empty list of launches, each a non-empty list of "
        "positive numbers")
    _require(_is_number(data.get("median")) and data["median"] > 0, path,
             f"'{where}.median' must be a positive number")
    _require(isinstance(data.get("higher_is_better", True), bool), path,
             f"'{where}.higher_is_better' must be true or false")
    _require(isinstance(data.get("unit", ""), str), path, f"'{where}.unit' must be a string")
    return Metric(launches=[[float(v) for v in launch] for launch in launches],
                  median=float(data["median"]),
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
    # Throughput first: a file wrong everywhere is named by its main figure.
    order = sorted(metrics, key=lambda name: (name != THROUGHPUT, name != EFFICIENCY, name))
    parsed = {name: _metric(name, metrics[name], path) for name in order}
    # Throughput and scaling efficiency are measured together, launch by launch; peak memory
    # may cover fewer (the newest) launches: older baselines had none.
    counts = {name: len(metric.launches) for name, metric in parsed.items() if name != MEMORY}
    _require(len(set(counts.values())) == 1, path,
             f"every metric must hold the same launches, got {counts}")
    return Baseline(
        case=data["case"], fingerprint=data["fingerprint"], metrics=parsed,
        tolerance=None if tolerance is None else float(tolerance), recorded=recorded,
        runs=_runs(data.get("runs", []), path), read_schema=read_schema)


def _runs(data: Any, path: Path) -> list[Run]:
    _require(isinstance(data, list), path, "'runs' must be a list")
    runs = []
    for i, run in enumerate(data):
        _require(isinstance(run, dict), path, f"'runs[{i}]' must be an object")
        count = run.get("launches")
        _require(isinstance(count, int) and not isinstance(count, bool) and count >= 1, path,
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
    action: str  # "recorded" | "updated" | "added" | "replaced-unreadable" | "kept"
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


def without_machine(fingerprint: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fingerprint.items() if k != "machine"}


class BaselineStore:
    def __init__(self, root: Path, repeats: int | None = None) -> None:
        self.root = root
        # The session's repeats: where to look for a schema-1 file of the same case.
        self.repeats = repeats

    def path_for(self, case: str, fingerprint: dict[str, Any],
                 machine: str | None = None) -> Path:
        """Under the fingerprint's machine's folder (or ``machine``'s); a fingerprint without
        a machine (recorded before machines were named) sits at the root."""
        machine = machine or fingerprint.get("machine")
        folder = self.root / machine if machine else self.root
        return folder / case_dirname(case) / f"{fingerprint_id(fingerprint)}.json"

    def _legacy(self, case: str, fingerprint: dict[str, Any],
                aliases: Sequence[tuple[str, dict[str, Any]]]) -> tuple[Path, dict[str, Any]] | None:
        """The first existing file in this machine's folder that older versions would have
        written for this baseline: under an alias (an older case key or fingerprint, as the
        caller knows them), with schema 1's repeat count in the fingerprint, or without a
        machine in the fingerprint (a file recorded before machines were named, which the user
        moved into this machine's folder: moving it says it was measured here). Returns its
        path and the fingerprint it must hold."""
        keys = [(case, fingerprint), *aliases]
        candidates = list(aliases)
        if self.repeats is not None and "protocol" in fingerprint:
            candidates += [(c, legacy_fingerprint(f, self.repeats)) for c, f in keys]
        machine = fingerprint.get("machine")
        if machine:
            candidates += [(c, without_machine(f)) for c, f in [*keys, *candidates]]
        for old_case, old_fp in candidates:
            path = self.path_for(old_case, old_fp, machine)
            if path.exists():
                return path, old_fp
        return None

    def found_batch(self, case: str, match: dict[str, Any]) -> int | None:
        """The batch an earlier ``--dlperf-batch-size max`` search found for this case on this
        machine, where a baseline of it agrees with ``match`` (the fingerprint's fields that
        bear on memory); the newest such baseline wins. None: no such baseline."""
        machine = match.get("machine")
        folder = (self.root / machine if machine else self.root) / case_dirname(case)
        found: list[tuple[str, int]] = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                baseline = read(path)
            except BaselineError:
                continue
            fp = baseline.fingerprint
            search = baseline.recorded.get("batch_search")
            if (fp.get("batch_size") != "max" or not isinstance(search, dict)
                    or any(fp.get(k) != v for k, v in match.items())):
                continue
            batch = search.get("found")
            if isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1:
                found.append((str(baseline.recorded.get("datetime") or ""), batch))
        return max(found)[1] if found else None

    def elsewhere(self, case: str, aliases: Sequence[str] = ()) -> tuple[list[str], Path | None]:
        """Where else this case has baselines: the other machines' names, and the folder of
        its baselines recorded before machines were named (None if there is none). For the
        message of a case with no baseline of its own."""
        names = [case_dirname(c) for c in (case, *aliases)]
        machines = sorted({folder.name for folder in self._machine_folders()
                           if any((folder / name).is_dir() for name in names)})
        unnamed = next((self.root / name for name in names if (self.root / name).is_dir()
                        and any((self.root / name).glob("*.json"))), None)
        return machines, unnamed

    def _machine_folders(self) -> list[Path]:
        try:
            return [p for p in self.root.iterdir() if p.is_dir()]
        except OSError:
            return []

    def load(self, case: str, fingerprint: dict[str, Any],
             aliases: Sequence[tuple[str, dict[str, Any]]] = ()) -> Baseline | None:
        """The baseline of ``case`` on ``fingerprint``; a file of it filed under an alias or
        schema 1 is migrated on read; None if there is none."""
        path = self.path_for(case, fingerprint)
        expected = fingerprint
        if not _present(path):
            legacy = self._legacy(case, fingerprint, aliases)
            if legacy is None:
                return None
            path, expected = legacy
        baseline = read(path)
        _require(baseline.fingerprint == expected, path,
                 "its fingerprint does not match its file name (edited by hand?)")
        baseline.case, baseline.fingerprint = case, fingerprint
        return baseline

    def update(self, baseline: Baseline, *, only_missing: bool = False, keep: int | None = None,
               aliases: Sequence[tuple[str, dict[str, Any]]] = ()) -> Change:
        """Write ``baseline``, under the store's lock so that two runs updating at once
        serialize: each reads the file the other wrote, nothing is torn and no update is lost.
        A per-baseline tolerance is carried over from the file replaced; an unreadable file is
        kept as ``.bak``; with ``only_missing`` an existing file is left alone; with ``keep``
        the new launches are added to the existing file's and the newest ``keep`` kept."""
        from filelock import FileLock, Timeout

        path = self.path_for(baseline.case, baseline.fingerprint)
        lock = FileLock(str(self.root / LOCK_NAME), timeout=LOCK_TIMEOUT_S)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with lock:
                return self._update_locked(path, baseline, only_missing, keep, aliases)
        except Timeout:  # a TimeoutError, so an OSError: first
            raise BaselineError(
                f"baseline file {path}: another run has held the lock {lock.lock_file} for "
                f"{LOCK_TIMEOUT_S:.0f} s; if no other pytest-dlperf run is updating baselines, "
                "delete the lock file and rerun") from None
        except OSError as exc:  # a full disk, permissions changed since start-up
            raise BaselineError(f"baseline file {path}: cannot be written ({exc}); the "
                                "baseline there was not changed") from exc

    def _update_locked(self, path: Path, baseline: Baseline, only_missing: bool,
                       keep: int | None, aliases: Sequence[tuple[str, dict[str, Any]]]
                       ) -> Change:
        old: Baseline | None = None
        problem: str | None = None
        found = (None if _present(path)
                 else self._legacy(baseline.case, baseline.fingerprint, aliases))
        legacy = found[0] if found else None
        current = path if legacy is None else legacy
        if _present(current):
            if only_missing:
                return Change(path, "kept", baseline)
            try:
                old = read(current)
            except BaselineError as exc:
                if current.is_dir():  # not a file to keep as .bak and replace
                    raise
                problem = str(exc)
                shutil.copy2(current, path.with_name(path.name + ".bak"))  # keep what we replace
        if old is not None and baseline.tolerance is None:
            baseline.tolerance = old.tolerance
        if old is not None and keep is not None:
            baseline = old.added(baseline, keep)
        write_json_atomic(path, baseline.to_json())
        if legacy is not None:
            legacy.unlink()  # superseded by the file just written: its figures are in `old`
            _remove_empty_parents(legacy.parent, self.root)
        action = ("replaced-unreadable" if problem else
                  ("added" if keep is not None else "updated") if old else "recorded")
        return Change(path, action, baseline, old, problem, migrated_from=legacy)

    def save(self, baseline: Baseline) -> Path:
        return self.update(baseline).path


def _present(path: Path) -> bool:
    """Whether something is at ``path``, readable or not (a dangling or looping link is there:
    it must fail as unreadable, not be taken for a missing baseline and replaced)."""
    return os.path.lexists(path)


def _remove_empty_parents(folder: Path, root: Path) -> None:
    """A migrated case leaves its old folders empty: remove them, up to the store's root."""
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:  # not empty
            return
        folder = folder.parent
