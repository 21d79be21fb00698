"""``--dlperf-history`` on the pytest side: the store opened before anything trains, each case
put at the end of its series and its change points found as it finishes, and the session's
cases appended when it ends (kept in a file when the store fails it)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from ..core.topology import fingerprint_id
from ..store.baselines import MEMORY, THROUGHPUT, Metric
from ..store.history import History, HistoryError, Point
from ..store.history_rows import case_row, run_record, save_unsaved
from ..verdict.changepoints import Step, blocking, steps
from ..verdict.record import CaseReport
from .settings import Settings


@dataclass(frozen=True)
class Judged:
    """A case's history: its runs (this one included), the steps of each metric, the one this
    run sits after unaccepted (it fails the case), and why it could not be read, if so."""

    runs: int | None = None
    steps: tuple[Step, ...] = ()
    blocking: Step | None = None
    unread: str | None = None


@dataclass
class HistoryKeeper:
    settings: Settings
    # The session's commit, asked when a case is first judged (the pytest_dlperf_commit_info
    # hook: by then every conftest that may answer it is loaded).
    commit: Callable[[], dict[str, Any]]
    store: History | None = None
    started_at: dt.datetime | None = None
    line: str | None = None  # what became of this run in it, for the summary

    @classmethod
    def open(cls, settings: Settings, commit: Callable[[], dict[str, Any]],
             source: str) -> HistoryKeeper:
        """Open (create, upgrade) the store before anything trains: a store that cannot take
        this run is a usage error now, not a lost run at the end."""
        assert settings.history is not None
        try:
            store = History.open(settings.history)
        except HistoryError as exc:
            raise pytest.UsageError(f"pytest-dlperf: bad value for {source}: {exc}") from None
        return cls(settings, commit, store, dt.datetime.now(dt.timezone.utc))

    def judge(self, case: str, fp: dict[str, Any], metrics: dict[str, Metric], outcome: str,
              baseline_action: str | None) -> Judged:
        """Put this run at the end of the case's series and find the steps of each metric."""
        assert self.store is not None
        run = run_record(self.settings.machine, {}, self.commit(), self.started_at)
        key = fingerprint_id(fp)
        try:
            series = {name: self.store.series(case, key, name) for name in metrics}
        except HistoryError as exc:
            return Judged(unread=f"pytest-dlperf: could not read {case}'s history, so its "
                                 f"change points were not checked: {exc}")
        finally:
            # No connection held through the next case's training: a server may drop idle
            # ones, and the write at the end opens its own.
            self.store.close()
        found: list[Step] = []
        runs, first_blocking = 0, None
        for name, metric in metrics.items():
            points = series[name]
            points.append(Point(None, run["started_at"], run["commit_id"], run["branch"],
                                run["host"], outcome, metric.launches, baseline_action))
            if name == THROUGHPUT:
                runs = len(points)
            these = steps(points, name, metric.unit, metric.higher_is_better,
                          self.settings.change_pvalue)
            found += these
            smallest = (self.settings.memory_tolerance if name == MEMORY
                        else self.settings.change_min)
            first_blocking = first_blocking or blocking(these, smallest)
        return Judged(runs, tuple(found), first_blocking)

    def save(self, reports: list[CaseReport]) -> bool:
        """Append the session's cases; False when the store failed it (the run is then kept in
        a file beside the baselines, and ``line`` says how to add it later)."""
        if self.store is None or not reports:
            return True
        run = run_record(self.settings.machine, self.settings.protocol.to_json(),
                         self.commit(), self.started_at)
        cases = [case_row(report, report.metrics) for report in reports]
        try:
            run_id = self.store.append(run, cases)
        except HistoryError as exc:
            stamp = run["started_at"].strftime("%Y%m%dT%H%M%SZ")
            kept = self.settings.baselines.parent / f"dlperf-history-unsaved-{stamp}.json"
            save_unsaved(kept, run, cases)
            self.line = (
                f"could not append this run to the history: {exc}. Its {len(cases)} case(s) "
                f"are kept in {kept}: `python -m pytest_dlperf history add {kept} URL` "
                "appends them once the store is back")
            return False
        self.line = f"appended run {run_id} ({len(cases)} case(s)) to {self.store.shown}"
        return True

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
