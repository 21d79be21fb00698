"""A case's baseline on the pytest side: found in the store (under this case's key or the keys
older versions filed it under), recorded when the run says so, and where else the case has
baselines when it has none here (other machines, before machines were named)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..core.batchsearch import Search
from ..core.phases import Phases
from ..core.protocol import Protocol
from ..core.topology import nearest_difference
from ..store import history_nights
from ..store.baselines import EFFICIENCY, THROUGHPUT, Baseline, BaselineError, Change, Metric, Run
from ..store.history import HistoryError
from ..verdict import drift
from ..verdict.drift import Drift
from .case import Case
from .outcome import fail


@dataclass(frozen=True)
class Elsewhere:
    """Where a case without a baseline here has one: other machines, and the folder of
    baselines recorded before machines were named (as messages show it)."""

    other_machines: tuple[str, ...] = ()
    unnamed: str | None = None
    # How this machine's nearest baseline of the case differs from its fingerprint.
    differs: str | None = None

    def fields(self) -> dict[str, Any]:
        """The case record's fields that say it."""
        return dict(other_machines=list(self.other_machines), unnamed_baselines=self.unnamed,
                    other_fingerprint=self.differs)


def load(case: Case, fp: dict[str, Any]) -> Baseline | None:
    """This case's baseline for ``fp``; a broken file fails the case, except when this run
    replaces every baseline (the unreadable file is then kept as ``.bak``)."""
    state = case.state
    try:
        return state.store.load(case.id, fp, case.aliases(case.id, fp))
    except BaselineError as exc:
        if state.settings.update_baselines == "all":
            return None
        fail(f"pytest-dlperf: {exc}")


def machine_drift(case: Case, fp: dict[str, Any]) -> dict[str, Drift]:
    """The machine's drift between runs for throughput and scaling efficiency, pooled over
    every baseline of this machine and device type recorded by two or more runs, else over its
    history's nights (``history_drift``); read once a session for each machine, device type and
    protocol (neither store changes under a judging run)."""
    state = case.state
    device = str(fp.get("device_type"))
    key = (fp.get("machine"), f"{device}, protocol {fp.get('protocol')}")
    if key not in state.drifts:
        found = {}
        for metric in (THROUGHPUT, EFFICIENCY):
            model = (drift.pooled(state.store.machine_runs(key[0], device, metric))
                     or history_drift(case, fp, metric))
            if model is not None:
                found[metric] = model
        state.drifts[key] = found
    return state.drifts[key]


def history_drift(case: Case, fp: dict[str, Any], metric: str) -> Drift | None:
    """The machine's drift between nights from ``--dlperf-history``: every case of this
    machine, device type and protocol, every night. None without a history (or one the
    reporting process did not open), or where it cannot be read: the verdict then takes its
    default bound, and its message says which."""
    keeper = case.state.history
    if keeper is None or keeper.store is None:
        return None
    try:
        return drift.from_history(history_nights.machine_series(keeper.store, fp, metric))
    except HistoryError:
        return None
    finally:
        keeper.store.close()  # no connection held through the case's training


def elsewhere(case: Case, fp: dict[str, Any]) -> Elsewhere:
    state = case.state
    others, unnamed = state.store.elsewhere(case.id, [c for c, _ in case.aliases(case.id, fp)])
    return Elsewhere(tuple(m for m in others if m != state.settings.machine),
                     case.display(unnamed) if unnamed else None,
                     described(nearest_difference(
                         fp, state.store.fingerprints(case.id, state.settings.machine))))


def described(differs: list[tuple[str, Any, Any]]) -> str | None:
    """Fields another baseline of the case differs in, as the message of a case without one
    says them: ``allocator (not recorded there, glibc mmap=32M trim=64M here)``."""
    if not differs:
        return None
    text = ", ".join(f"{key} ({'not recorded' if there is None else there} there, "
                     f"{'not recorded' if here is None else here} here)"
                     for key, there, here in differs)
    if [(key, there) for key, there, _ in differs] == [("allocator", None)]:
        text += (": it was recorded before the ranks' heap allocator was part of the "
                 "fingerprint, on glibc as it comes, which --dlperf-allocator glibc-dynamic "
                 "judges against")
    return text


def reference_median(case: Case, other: str | None, fp: dict[str, Any]
                     ) -> tuple[float, Phases | None] | None:
    """The 1n1d median of test ``other`` (this test at 1n1d) and its phases, from this
    session's cases, else from its baseline; None where neither has it. Not from a case this
    session refused to record (windows too far apart to measure anything): nothing derived
    from it may be recorded either (a scaling efficiency of 2787% once was)."""
    state = case.state
    for report in state.reports:
        if report.case == other and report.fingerprint == fp and not report.record_refused:
            return report.result.median, report.phases
    if not other:
        return None
    try:
        baseline = state.store.load(other, fp, case.aliases(other, fp))
    except BaselineError:
        return None
    return (baseline.throughput.median, recorded_phases(baseline)) if baseline is not None \
        else None


def recorded_phases(baseline: Baseline | None) -> Phases | None:
    """The phases the baseline's recording run measured; None where it measured none."""
    found = baseline.recorded.get("phases") if baseline is not None else None
    return Phases.from_json(found) if found else None


def recorded(environment: dict[str, Any], protocol: Protocol, batch_search: Search | None,
             commit: dict[str, Any], phases: Phases | None = None) -> dict[str, Any]:
    """What a baseline keeps about the run that recorded it (its phases: what a regression's
    message compares against)."""
    search = {batch_search.record_key: batch_search.to_json()} if batch_search else {}
    return {
        **search,
        **({"phases": phases.to_json()} if phases is not None else {}),
        "datetime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit.get("id"),
        "dirty": commit.get("dirty"),
        # (not where the ranks imported their code from: paths of this checkout and user, a
        # committed baseline's churn; the results file keeps them)
        "environment": {k: v for k, v in environment.items() if k != "imports"},
        "protocol": protocol.to_json(),
    }


def record(case: Case, fp: dict[str, Any], metrics: dict[str, Metric],
           recorded: dict[str, Any], launches: int, update: str | None,
           keep: int) -> Change | None:
    """Write this run's figures as the case's baseline (``update``: "all", "add" or
    "missing", as --dlperf-update-baselines)."""
    run = Run(recorded["datetime"], recorded["commit"], recorded["dirty"], launches)
    try:
        return case.state.store.update(
            Baseline(case=case.id, fingerprint=fp, metrics=metrics, recorded=recorded,
                     runs=[run]),
            only_missing=update == "missing", keep=keep if update == "add" else None,
            aliases=case.aliases(case.id, fp))
    except BaselineError as exc:
        fail(f"pytest-dlperf: {exc}")
