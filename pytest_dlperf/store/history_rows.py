"""The rows a session adds to the history (``history.History.append``): its run (when, which
commit, branch and host) and each case (key, fingerprint, verdict, every window of each metric,
what each launch ran beside, where its step's time went),
and the file that keeps them when the store could not take them (``python -m pytest_dlperf
history add`` appends it later); and what a series reads back of each run (``Point``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.jsonio import write_json_atomic
from ..core.protocol import median_of_launches
from ..core.topology import fingerprint_id

# Baseline actions that accept what the run measured as the case's new level (``add`` only
# grows an existing baseline with more launches; ``kept`` left it alone).
ACCEPTING = ("recorded", "updated", "replaced-unreadable")


@dataclass
class Point:
    """One run of one case: its samples of one metric, by launch."""

    run_id: int | None  # None: this session's run, not stored yet
    started_at: dt.datetime
    commit_id: str | None
    branch: str | None
    host: str
    verdict: str | None
    launches: list[list[float]] = field(default_factory=list)
    baseline_action: str | None = None  # what the run did to the case's baseline
    # Where its step's time went (``Phases.to_json``); None: no diagnostic steps ran.
    phases: dict[str, Any] | None = None

    @property
    def baseline_recorded(self) -> bool:
        """The run recorded the case's baseline: what it measured is the accepted level."""
        return self.baseline_action in ACCEPTING

    @property
    def median(self) -> float:
        """The median of the launch medians: the figure the verdict judges."""
        return median_of_launches(self.launches)

    @property
    def values(self) -> list[float]:
        return [v for launch in self.launches for v in launch]


def run_record(machine: str, protocol: dict[str, Any], commit: dict[str, Any],
               started_at: dt.datetime | None = None) -> dict[str, Any]:
    """The run row for this session: ``commit`` as pytest-benchmark's ``get_commit_info``
    gives it (id, branch, dirty); CI's own variables win where git cannot tell (a detached
    checkout's branch)."""
    from .. import __version__

    branch = (os.environ.get("GITHUB_HEAD_REF") or os.environ.get("GITHUB_REF_NAME")
              or commit.get("branch"))
    if branch in ("(unknown)", "HEAD"):
        branch = None
    commit_id = commit.get("id")
    if commit_id == "unversioned":  # pytest-benchmark's word for "not in a git checkout"
        commit_id = None
    return {"started_at": started_at or dt.datetime.now(dt.timezone.utc),
            "commit_id": commit_id or os.environ.get("GITHUB_SHA"),
            "branch": branch, "dirty": commit.get("dirty"), "host": socket.gethostname(),
            "machine": machine, "plugin_version": __version__, "protocol": protocol}


def case_row(report: Any, metrics: dict[str, Any]) -> dict[str, Any]:
    """A case of this session (a ``CaseReport``) as ``append`` takes it; ``metrics``: its
    figures by name, each with ``launches`` (``CaseReport.metrics``); its phases are the
    figures of every launch's diagnostic steps (``CaseReport.phases``)."""
    return {"case_key": report.case, "fingerprint": report.fingerprint,
            "fingerprint_id": fingerprint_id(report.fingerprint),
            "framework": report.framework, "model": str(report.fingerprint.get("model")),
            "unit": report.workload.unit, "verdict": report.verdict.outcome,
            "baseline_action": report.baseline_action,
            "interference": [seen.to_json() for seen in report.result.interference],
            "phases": report.phases.to_json() if report.phases is not None else None,
            "metrics": {name: metric.launches for name, metric in metrics.items()}}


def save_unsaved(path: Path, run: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    """A run the store could not take, as ``python -m pytest_dlperf history add`` reads it."""
    write_json_atomic(path, {"run": {**run, "started_at": run["started_at"].isoformat()},
                             "cases": cases})


def load_unsaved(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = json.loads(Path(path).read_text())
    run = dict(data["run"])
    run["started_at"] = dt.datetime.fromisoformat(run["started_at"])
    return run, list(data["cases"])
