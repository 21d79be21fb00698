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

import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..core.jsonio import write_json_atomic
from ..core.topology import fingerprint_id
from .baseline_file import (
    EFFICIENCY,
    MEMORY,
    SCHEMA_VERSION,
    THROUGHPUT,
    Baseline,
    BaselineError,
    Metric,
    Run,
    read,
    require,
)

__all__ = ["EFFICIENCY", "LOCK_NAME", "MEMORY", "SCHEMA_VERSION", "THROUGHPUT", "Baseline",
           "BaselineError", "BaselineStore", "Change", "Metric", "Run", "read"]

LOCK_NAME = ".dlperf.lock"
LOCK_TIMEOUT_S = 120.0


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

    def fitted_before(self, case: str, match: dict[str, Any]) -> Path | None:
        """A baseline of this case on this machine whose fingerprint agrees with ``match`` (the
        fields that bear on memory): the case trained at those sizes when it was recorded. The
        newest such file; None: none."""
        found = None
        for path, baseline in self._readable(case, match.get("machine")):
            if all(baseline.fingerprint.get(k) == v for k, v in match.items()):
                if found is None or path.stat().st_mtime > found.stat().st_mtime:
                    found = path
        return found

    def _readable(self, case: str, machine: str | None) -> Iterator[tuple[Path, Baseline]]:
        """This case's baselines in ``machine``'s folder that can be read (the others are
        skipped: a broken one fails its own case when it is loaded)."""
        folder = (self.root / machine if machine else self.root) / case_dirname(case)
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                yield path, read(path)
            except BaselineError:
                continue

    def found_size(self, case: str, match: dict[str, Any], size: str = "batch_size"
                   ) -> int | None:
        """The value an earlier ``--dlperf-batch-size max`` (``size`` ``batch_size``) or
        ``--dlperf-size NAME=max`` search found for this case on this machine, where a baseline
        of it agrees with ``match`` (the fingerprint's fields that bear on memory, the searched
        size's "max" among them); the newest such baseline wins. None: no such baseline."""
        found: list[tuple[str, int]] = []
        for _, baseline in self._readable(case, match.get("machine")):
            fp = baseline.fingerprint
            search = baseline.recorded.get("batch_search" if size == "batch_size"
                                           else "size_search")
            if (fp.get(size) != "max" or not isinstance(search, dict)
                    or search.get("size", "batch_size") != size
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

    def fingerprints(self, case: str, machine: str | None) -> list[dict[str, Any]]:
        """The fingerprints of ``case``'s readable baselines on ``machine`` (None: the store's
        root), for the message of a case with none of its own fingerprint."""
        folder = (self.root / machine if machine else self.root) / case_dirname(case)
        found = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                found.append(read(path).fingerprint)
            except BaselineError:
                continue
        return found

    def _machine_folders(self) -> list[Path]:
        try:
            return [p for p in self.root.iterdir() if p.is_dir()]
        except OSError:
            return []

    def machine_runs(self, machine: str | None, device_type: str, metric: str
                     ) -> list[tuple[list[list[float]], list[int]]]:
        """Every readable baseline of ``machine`` (None: the store's root) on this device type
        that was recorded by two or more runs: its ``metric``'s launches and the launches each
        run gave (oldest first). The machine's drift between runs is pooled from them
        (``verdict.drift``)."""
        folder = self.root / machine if machine else self.root
        found = []
        for path in sorted(folder.rglob("*.json")) if folder.is_dir() else []:
            try:
                baseline = read(path)
            except BaselineError:
                continue
            chosen = baseline.metrics.get(metric)
            sizes = [run.launches for run in baseline.runs]
            if (chosen is None or baseline.fingerprint.get("device_type") != device_type
                    or len(sizes) < 2 or sum(sizes) != len(chosen.launches)):
                continue
            found.append((chosen.launches, sizes))
        return found

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
        require(baseline.fingerprint == expected, path,
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
        path = self.path_for(baseline.case, baseline.fingerprint)
        return self._locked(path, lambda: self._update_locked(path, baseline, only_missing, keep,
                                                              aliases))

    def add_run(self, baseline: Baseline, keep_runs: int) -> Change:
        """Add ``baseline``'s launches (one run's: a night's) to the case's existing file as one
        more run, keeping the newest ``keep_runs`` runs, the file's tolerance and its record
        of the run that recorded it; under the store's lock. Raises ``BaselineError`` where
        there is no such file, it cannot be read, or its figures cannot be lined up with the
        run's (one holds a scaling efficiency the other lacks): nothing is written then."""
        path = self.path_for(baseline.case, baseline.fingerprint)
        return self._locked(path, lambda: self._add_run_locked(path, baseline, keep_runs))

    def _add_run_locked(self, path: Path, baseline: Baseline, keep_runs: int) -> Change:
        if not _present(path):
            raise BaselineError(f"baseline file {path}: not there, so nothing to add to")
        old = read(path)
        require(old.fingerprint == baseline.fingerprint, path,
                "its fingerprint does not match its file name (edited by hand?)")
        timing = {THROUGHPUT, EFFICIENCY}
        require(set(old.metrics) & timing == set(baseline.metrics) & timing, path,
                f"holds {sorted(set(old.metrics) & timing)}, the run "
                f"{sorted(set(baseline.metrics) & timing)}: its runs cannot be lined up")
        runs = old.runs
        if sum(run.launches for run in runs) != old.launch_count:  # they count as one run
            runs = [Run(old.recorded.get("datetime"), old.recorded.get("commit"),
                        old.recorded.get("dirty"), old.launch_count)]
        kept = runs[len(runs) - keep_runs + 1:] if keep_runs > 1 else []
        keep = sum(run.launches for run in kept) + baseline.launch_count
        new = replace(old, runs=runs).added(
            Baseline(baseline.case, baseline.fingerprint, baseline.metrics, old.tolerance,
                     old.recorded, baseline.runs), keep)
        write_json_atomic(path, new.to_json())
        return Change(path, "added", new, old)

    def _locked(self, path: Path, work: Callable[[], Change]) -> Change:
        """``work`` under the store's lock (a write to ``path``), its failures as
        ``BaselineError``s naming the file."""
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.root / LOCK_NAME), timeout=LOCK_TIMEOUT_S)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with lock:
                return work()
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
