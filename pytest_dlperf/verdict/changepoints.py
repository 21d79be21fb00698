"""Change points in a case's history: where its series of nightly figures stepped, and whether
tonight sits after a step for the worse that nobody accepted.

The detector is E-Divisive means (Matteson and James, "A Nonparametric Approach for Multiple
Change Point Analysis of Multivariate Data", JASA 109(505), 2014) with the significance test of
Hunter (Fleming et al., "Hunter: Using Change Point Detection to Hunt for Performance
Regressions", ICPE 2023; the tool is now Apache Otava, the E-Divisive DataStax and MongoDB run on
their performance histories), written here from the papers:

1. In a segment, the split that maximizes the energy statistic
   ``q(t) = m k / (m + k) * (2 E|X - Y| - E|X - X'| - E|Y - Y'|)`` (X the m points before t, Y the
   k points from t on) is the candidate: distances, not means, so one wild night moves it little.
2. The candidate stands when Student's t-test between the two sides gives ``p <= max_pvalue``
   (E-Divisive's permutation test is random; the t-test is deterministic, so the same history
   always gives the same answer, which a gate needs). Both sides are then split again.
3. Once nothing more splits, every point is tested again between its neighbours (the segments
   either side of it, not the whole series) and the weakest one that no longer holds is dropped,
   until all hold.

Deterministic, numpy and scipy only (both are dependencies already). Apache Otava itself pins
numpy 2.2 and pulls BigQuery and Slack clients; ``signal-processing-algorithms`` needs numpy < 2
and its test is random: docs/history.md "Change points" has what was measured.

One value per run (the run's median, the figure its verdict judged). Within a run, windows and
launches are not independent of each other the way runs are (a launch's placement moves all its
windows), so a test on every window would cry wolf, as the single-run verdict's history showed.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.units import format_bytes
from .stats import pooled_t_test

if TYPE_CHECKING:
    from ..store.history import Point

# Hunter's default threshold. The simulation (benchmarks/change_points.py) measured what it
# buys on this project's noise.
MAX_PVALUE = 0.001
# Runs on each side of a step: 2 needs a second night to confirm what one slow night says, so a
# single bad night (a noisy neighbour) is not a step.
MIN_SIZE = 2
# The smallest step of throughput or scaling efficiency that fails a run (peak memory's is the
# memory tolerance): a significant step smaller than this is reported, not failed.
MIN_CHANGE = 0.01
# The metrics' short names (the baseline's keys are the history's).
NAMES = {"samples_per_s": "throughput", "peak_memory_bytes": "peak memory",
         "scaling_efficiency": "scaling efficiency"}


@dataclass(frozen=True)
class ChangePoint:
    """A step in a series: ``index`` is the first point after it."""

    index: int
    before: float  # mean of the segment before the step
    after: float  # mean of the segment after it (up to the next step)
    pvalue: float

    @property
    def change(self) -> float:
        """Relative change, after / before - 1."""
        return self.after / self.before - 1 if self.before else math.inf


def detect(values: Sequence[float], max_pvalue: float = MAX_PVALUE,
           min_size: int = MIN_SIZE) -> list[ChangePoint]:
    """The change points of ``values`` (oldest first), in order."""
    import numpy as np

    if min_size < 1:
        raise ValueError(f"min_size must be at least 1, not {min_size}")
    if not 0 < max_pvalue < 1:
        raise ValueError(f"max_pvalue must be in (0, 1), not {max_pvalue}")
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise ValueError("values must be a flat sequence of finite numbers")
    n = len(x)
    splits: list[int] = []
    pending = [(0, n)]
    while pending:
        start, end = pending.pop()
        at = _best_split(x[start:end], min_size)
        if at is None:
            continue
        split = start + at
        if _t_test(x[start:split], x[split:end]) <= max_pvalue:
            splits.append(split)
            pending += [(start, split), (split, end)]
    splits.sort()
    while splits:  # every step must hold between its own neighbours
        bounds = [0, *splits, n]
        pvalues = [_t_test(x[bounds[i]:bounds[i + 1]], x[bounds[i + 1]:bounds[i + 2]])
                   for i in range(len(splits))]
        weakest = max(range(len(splits)), key=pvalues.__getitem__)
        if pvalues[weakest] <= max_pvalue:
            bounds = [0, *splits, n]
            return [ChangePoint(s, float(x[bounds[i]:s].mean()),
                                float(x[s:bounds[i + 2]].mean()), float(pvalues[i]))
                    for i, s in enumerate(splits)]
        del splits[weakest]
    return []


def _best_split(x: Any, min_size: int) -> int | None:
    """The split of ``x`` (the index of the first point after it) with the largest energy
    statistic, keeping ``min_size`` points on each side; None when ``x`` is too short."""
    import numpy as np

    n = len(x)
    if n < 2 * min_size:
        return None
    distance = np.abs(x[:, None] - x[None, :])
    # corner[i, j]: the sum of distance[:i, :j], so any block's sum is four lookups.
    corner = np.zeros((n + 1, n + 1))
    corner[1:, 1:] = distance.cumsum(0).cumsum(1)
    t = np.arange(min_size, n - min_size + 1)
    m, k = t.astype(float), (n - t).astype(float)
    total = corner[n, n]
    within_before = corner[t, t]  # ordered pairs, so each distance twice
    across = corner[t, n] - within_before
    within_after = total - 2 * across - within_before
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_before = np.where(m > 1, within_before / (m * (m - 1)), 0.0)
        mean_after = np.where(k > 1, within_after / (k * (k - 1)), 0.0)
    q = m * k / n * (2 * across / (m * k) - mean_before - mean_after)
    return int(t[int(np.argmax(q))])


def _t_test(a: Any, b: Any) -> float:
    """Two-sided p of Student's t-test (pooled variance) that ``a`` and ``b`` share a mean."""
    test = pooled_t_test([float(v) for v in a], [float(v) for v in b])
    return 1.0 if test is None else test.p_two_sided


# -- a case's history --------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """A change point of one metric in a case's history, with the runs either side of it."""

    metric: str
    unit: str
    higher_is_better: bool
    point: ChangePoint
    first: Point  # the first run after the step
    last_before: Point  # the last run before it
    runs_since: int  # runs from the first one after the step to the newest, inclusive
    accepted: bool  # a run from the step on recorded the case's baseline

    @property
    def name(self) -> str:
        return NAMES.get(self.metric, self.metric)

    @property
    def worse(self) -> bool:
        return (self.point.change < 0) == self.higher_is_better

    def describe(self) -> str:
        """"images/s dropped 7.2% (13.05 -> 12.11, p=0.0003) at commit abc1234 (run 17,
        night of 2026-11-20; the run before: commit 9f8e7d6)"."""
        verb = "rose" if self.point.change > 0 else "dropped"
        label = self.unit if self.metric == "samples_per_s" else self.name
        before, after = (_figure(v, self.unit) for v in (self.point.before, self.point.after))
        return (f"{label} {verb} {abs(self.point.change):.1%} ({before} -> {after}, "
                f"p={self.point.pvalue:.2g}) at {_where(self.first)}; the run before: "
                f"{_commit(self.last_before)}")

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "text": self.describe(), "change": self.point.change,
                "before": self.point.before, "after": self.point.after,
                "pvalue": self.point.pvalue, "worse": self.worse, "accepted": self.accepted,
                "runs_since": self.runs_since, "run_id": self.first.run_id,
                "commit": self.first.commit_id, "started_at": self.first.started_at.isoformat(),
                "commit_before": self.last_before.commit_id}


def steps(points: Sequence[Point], metric: str, unit: str, higher_is_better: bool,
          max_pvalue: float = MAX_PVALUE, min_size: int = MIN_SIZE) -> list[Step]:
    """The steps of one metric over ``points`` (a case's runs, oldest first)."""
    found = detect([p.median for p in points], max_pvalue, min_size)
    out = []
    for cp in found:
        out.append(Step(metric, unit, higher_is_better, cp, points[cp.index],
                        points[cp.index - 1], len(points) - cp.index,
                        any(p.baseline_recorded for p in points[cp.index:])))
    return out


def blocking(found: Sequence[Step], min_change: float = 0.0) -> Step | None:
    """The step the newest run sits after when it is one for the worse that no run since has
    accepted (by recording the baseline); None otherwise. A later step (a fix, another change)
    decides instead: only the newest step matters. Steps smaller than ``min_change`` (relative)
    do not count: a metric as steady as peak memory shows significant steps of 1%."""
    large = [step for step in found if abs(step.point.change) >= min_change]
    if not large:
        return None
    newest = large[-1]
    return newest if newest.worse and not newest.accepted else None


def _figure(value: float, unit: str) -> str:
    if unit == "bytes":
        return format_bytes(value)
    if unit == "fraction":
        return f"{value:.1%}"
    return f"{value:,.2f}"


def _commit(point: Point) -> str:
    return f"commit {point.commit_id[:7]}" if point.commit_id else "no commit recorded"


def _where(point: Point) -> str:
    night = point.started_at.astimezone(dt.timezone.utc).date().isoformat()
    run = "this run" if point.run_id is None else f"run {point.run_id}"
    return f"{_commit(point)} ({run}, night of {night})"
