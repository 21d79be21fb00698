"""The nightly's rolling baselines (``dlperf nightly``): each night that passed adds its run to
the runner's baselines as one more run, the newest ``KEEP_NIGHTS`` nights kept. From night 2 on
a case's baseline holds two runs or more, so the verdict knows the runner's drift between nights
(pooled over every case of the machine, ``verdict.drift``) instead of a default bound, and the
estimate grows night after night; the window forgets the machine as it was weeks ago (a driver,
a kernel, a neighbour since).

A night's figures come from its baseline session's results file (``--dlperf-json``): per case
its fingerprint, its launches (``samples_per_s_launches``, ``scaling_efficiency_launches``,
``peak_memory_launches``), its verdicts and what the session wrote to its baseline. A case is
added where its baseline judged it and found no change: a throughput verdict of pass or
inconclusive (an unchanged night beyond the tolerance that the drift between runs explains is
the very drift the baseline must learn: without such nights it would read the drift smaller
than it is, and fail unchanged nights), no regression or improvement of its scaling efficiency
or memory, no step of its history that failed it, and a baseline the session did not write
itself (a night that recorded it already holds the night's run).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..core.protocol import median_of_launches
from .baselines import (
    EFFICIENCY,
    MEMORY,
    THROUGHPUT,
    Baseline,
    BaselineError,
    BaselineStore,
    Change,
    Metric,
    Run,
)

# Two weeks of nights: 13 degrees of freedom of a case's own between its runs (Student's t at
# the verdict's level ~3.0, where 3 runs give ~9.9 and 2 runs ~64), every weekday seen twice
# (a weekend's quieter runner is part of its drift), and a machine as it was a fortnight ago
# forgotten; a file keeps 14 nights' launches (42 at the default 3 a night).
KEEP_NIGHTS = 14
# What a session wrote to a baseline (``Change.action``): the file holds its run already.
WRITTEN = ("recorded", "updated", "replaced-unreadable", "added")
# Throughput verdicts whose night is added: no change proven (``verdict.stats``' outcomes).
ADDED = ("pass", "inconclusive")


def add_night(store_root: Path, results: dict[str, Any], keep_runs: int = KEEP_NIGHTS
              ) -> list[str]:
    """Add each case of a night's baseline session (``results``: its results file, read) to
    the runner's baselines under ``store_root`` as one more run, keeping each baseline's newest
    ``keep_runs`` runs (``BaselineStore.add_run``: under the store's lock, the file's tolerance
    and its recording run's record kept). One line a case, in the results' order: what was
    added, or why it was skipped (a file that cannot be read is skipped and left as it is)."""
    if keep_runs < 2:
        raise ValueError(f"keep_runs must be 2 or more (a baseline of one run knows no drift "
                         f"between runs), got {keep_runs}")
    store = BaselineStore(Path(store_root))
    lines = []
    for bench in results.get("benchmarks") or []:
        info = bench.get("extra_info") or {}
        case = str(info.get("case") or bench.get("fullname") or "?")
        night, why = night_run(info, results.get("datetime"), results.get("commit_info") or {})
        if night is None:
            lines.append(f"{case}: skipped: {why}")
            continue
        try:
            change = store.add_run(night, keep_runs)
        except BaselineError as exc:
            lines.append(f"{case}: skipped: {exc}")
            continue
        lines.append(f"{case}: {added(change, keep_runs)}")
    return lines


def night_run(info: dict[str, Any], when: str | None, commit: dict[str, Any]
              ) -> tuple[Baseline | None, str]:
    """A case of the results (``extra_info``) as one run to add (None, and why not)."""
    why = why_not(info)
    fingerprint = info.get("fingerprint")
    launches = _launches(info.get("samples_per_s_launches"))
    if why is None and (not isinstance(fingerprint, dict) or launches is None):
        why = ("the results hold no fingerprint or launches for it (not a --dlperf-json file "
               "of a baseline session?)")
    if why is not None or launches is None or not isinstance(fingerprint, dict):
        return None, why or ""
    metrics = {THROUGHPUT: _metric(launches, True, f"{info.get('unit') or 'samples'}/s")}
    efficiency = _launches(info.get("scaling_efficiency_launches"))
    if info.get("scaling_efficiency") is not None:
        if efficiency is None or len(efficiency) != len(launches):
            return None, ("its scaling efficiency's launches are not in the results (a results "
                          "file written before they were)")
        metrics[EFFICIENCY] = _metric(efficiency, True, "fraction")
    memory = _launches(info.get("peak_memory_launches"))
    if memory is not None:
        metrics[MEMORY] = _metric(memory, False, "bytes")
    run = Run(when, commit.get("id"), commit.get("dirty"), len(launches))
    return Baseline(str(info.get("case")), fingerprint, metrics, runs=[run]), ""


def why_not(info: dict[str, Any]) -> str | None:
    """Why a case's night is not the runner's drift to learn (None: it is)."""
    if info.get("ab"):
        return "an A/B session's results (head against base): add the baseline session's"
    written = (info.get("baseline_update") or {}).get("action")
    if written in WRITTEN:
        return f"tonight's session wrote its baseline ({written}): it holds tonight's run"
    outcome = (info.get("verdict") or {}).get("outcome")
    if outcome not in ADDED:
        return {"regression": "a regression: the code's change, not the runner's drift",
                "improvement": "an improvement: a faster level is recorded anew (dlperf "
                               "nightly accept), not averaged in",
                "no-baseline": "no baseline judged it"}.get(str(outcome), f"judged {outcome}")
    for name, what in (("efficiency_verdict", "scaling efficiency"),
                       ("memory_verdict", "peak memory")):
        other = (info.get(name) or {}).get("outcome")
        if other in ("regression", "improvement"):
            return f"its {what} was judged a {other}: the code's change, not the runner's drift"
    if (info.get("history") or {}).get("blocking") is not None:
        return "a step in its history failed it"
    return None


def added(change: Change, keep_runs: int) -> str:
    """The line of a case whose night was added."""
    new, old = change.new, change.old
    before = f"{old.throughput.median:,.2f} -> " if old is not None else ""
    return (f"added tonight's run: {before}{new.throughput.median:,.2f} "
            f"{new.throughput.unit} over {len(new.runs)} run(s) ({new.launch_count} launches; "
            f"the newest {keep_runs} nights kept)  [{change.path}]")


def _launches(value: Any) -> list[list[float]] | None:
    """Window figures by launch, as the results keep them; None: absent or not such a list."""
    if not isinstance(value, list) or not value:
        return None
    found = []
    for launch in value:
        if not isinstance(launch, list) or not launch or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and v > 0 for v in launch):
            return None
        found.append([float(v) for v in launch])
    return found


def _metric(launches: list[list[float]], higher_is_better: bool, unit: str) -> Metric:
    return Metric(launches, median_of_launches(launches), higher_is_better, unit)


__all__ = ["ADDED", "KEEP_NIGHTS", "WRITTEN", "add_night", "night_run", "why_not"]
