"""The machine's drift between runs, pooled over every case of its baselines.

Evidence comes in three levels (``levels``): windows within launches within runs. A baseline
recorded by a few runs knows its own case's drift between runs with ``runs - 1`` degrees of
freedom: two, from three runs, where Student's t at the verdict's level is ~10 and nothing short
of a 2x change can be proven (a ~28% slower model passed as "inconclusive" every time). But the
drift between runs is a property of the **machine** (its clock, its neighbours, its thermal and
cache state between sessions), not of one case: on a log scale every case of one machine moves
by the same relative amount between two sessions, give or take its own launches' noise. So the
between-run spread is estimated once, from every baseline of this machine and device type that
was recorded by two or more runs, a hierarchical model

    log(launch median) = case level + run drift (sd sigma_run) + launch noise (sd sigma_launch)

fitted by pooled one-way analysis of variance: the variance of run means around their case's
mean (``between``: sigma_run^2 + sigma_launch^2 / launches per run) with ``sum(runs - 1)``
degrees of freedom, and the variance of launches around their run's mean (``within``:
sigma_launch^2) with ``sum(launches - 1)``. Ten cases of three runs give twenty degrees of
freedom where one gave two. A one-run baseline is judged by the same pooled drift where other
cases of the machine give it (weaker than a baseline of several runs, and the message says so).

Where no baseline of the machine holds two runs (a store of one-run baselines, a nightly's
first nights), its **history** (``--dlperf-history``) may: every night of every case of this
machine, device type and protocol is a run, and ``from_history`` pools its nights alike
(``Drift.source`` then says so). A night the verdict called a change (a regression, an
improvement) is the code's, not the machine's, and is left out; a night that recorded the
baseline anew (a change a person accepted) starts the case afresh, so a step between levels is
never read as drift.

What pooling assumes, and the docs say: runs of different cases are alike in how they drift
(one machine, one device type; a case whose runs drift more than the machine's pooled figure
is judged too boldly, which its own between-run spread, taken where it is larger, guards
against), and the baseline's runs sample the drift a later run meets (runs recorded over a day,
not one after another: ``docs/verdict.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..core.protocol import split
from ..store.history_rows import Point
from .stats import IMPROVEMENT, REGRESSION, Launches, launch_medians


@dataclass(frozen=True)
class Drift:
    """Pooled variance components on the log scale (``between``, ``within``), their degrees
    of freedom, the typical launches per run, and how many cases and runs gave them."""

    between: float  # variance of a run's mean log launch median around its case's mean
    between_df: int
    within: float  # variance of a launch's log median around its run's mean
    within_df: int
    launches_per_run: float
    cases: int
    runs: int
    # Where it was pooled from, as messages say it: "" for the machine's baselines, else the
    # history's nights ("the history's 12 nights of 3 cases").
    source: str = ""

    @property
    def run_variance(self) -> float:
        """sigma_run^2: what runs add beyond their launches' own spread (never below 0)."""
        return max(0.0, self.between - self.within / self.launches_per_run)

    @property
    def spread(self) -> float:
        """The standard deviation of a run's mean (~ its relative drift)."""
        return math.sqrt(self.between)

    def describe(self) -> str:
        where = (f"from {self.source}" if self.source else
                 f"pooled over {self.runs} runs of {self.cases} "
                 f"case{'s' if self.cases != 1 else ''}")
        return (f"drift between runs {self.spread:.1%} {where} on this machine "
                f"({self.between_df} degrees of freedom)")


def case_components(launches: Launches, sizes: Sequence[int]
                    ) -> tuple[list[float], float, int]:
    """One case's run means (log launch medians) and its sum of squares of launches around
    their run's mean with its degrees of freedom."""
    groups = split([math.log(v) for v in launch_medians(launches)], list(sizes))
    means = [math.fsum(g) / len(g) for g in groups]
    ss = math.fsum((v - m) ** 2 for g, m in zip(groups, means) for v in g)
    return means, ss, sum(len(g) - 1 for g in groups)


def pooled(cases: Iterable[tuple[Launches, Sequence[int]]]) -> Drift | None:
    """The machine's drift from its cases' baselines (each: its launches and the launches per
    run that recorded them, oldest first); None where no case has two runs."""
    ss_between = ss_within = 0.0
    df_between = df_within = n_cases = n_runs = launches = 0
    for case_launches, sizes in cases:
        if len(sizes) < 2 or sum(sizes) != len(case_launches) or min(sizes) < 1:
            continue
        means, ss, df = case_components(case_launches, sizes)
        grand = math.fsum(means) / len(means)
        ss_between += math.fsum((m - grand) ** 2 for m in means)
        df_between += len(means) - 1
        ss_within += ss
        df_within += df
        n_cases += 1
        n_runs += len(means)
        launches += sum(sizes)
    if df_between < 1:
        return None
    return Drift(ss_between / df_between, df_between,
                 ss_within / df_within if df_within else 0.0, df_within,
                 launches / n_runs, n_cases, n_runs)


def from_history(series: Iterable[Sequence[Point]]) -> Drift | None:
    """The machine's drift between nights from its history: ``series``, each case's nights
    (one case and fingerprint, oldest first, a night's launches of one metric), split where a
    night recorded the baseline anew and without the nights the verdict called a change; the
    parts of two nights or more pooled as ``pooled`` pools baselines' runs. None where no case
    has two such nights."""
    groups: list[tuple[Launches, list[int]]] = []
    nights: set[object] = set()
    cases = 0
    for points in series:
        parts = [part for part in _levels(points) if len(part) > 1]
        for part in parts:
            groups.append(([launch for point in part for launch in point.launches],
                           [len(point.launches) for point in part]))
            nights.update(point.run_id if point.run_id is not None else id(point)
                          for point in part)
        cases += bool(parts)
    model = pooled(groups)
    if model is None:
        return None
    return replace(model, cases=cases, source=f"the history's {len(nights)} night"
                                 f"{'s' if len(nights) != 1 else ''} of {cases} "
                                 f"case{'s' if cases != 1 else ''}")


def _levels(points: Sequence[Point]) -> list[list[Point]]:
    """A case's nights by the baseline level they were judged against: a new part from each
    night that recorded the baseline; a night whose verdict was a change left out (not one
    that recorded: its figures are the level a person accepted)."""
    parts: list[list[Point]] = [[]]
    for point in points:
        if not point.launches or not all(point.launches):
            continue
        if point.baseline_recorded:
            parts.append([])
        elif point.verdict in (REGRESSION, IMPROVEMENT):
            continue
        parts[-1].append(point)
    return parts


__all__ = ["Drift", "case_components", "from_history", "pooled"]
