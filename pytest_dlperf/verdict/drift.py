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

What pooling assumes, and the docs say: runs of different cases are alike in how they drift
(one machine, one device type; a case whose runs drift more than the machine's pooled figure
is judged too boldly, which its own between-run spread, taken where it is larger, guards
against), and the baseline's runs sample the drift a later run meets (runs recorded over a day,
not one after another: ``docs/verdict.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..core.protocol import split
from .stats import Launches, launch_medians


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

    @property
    def run_variance(self) -> float:
        """sigma_run^2: what runs add beyond their launches' own spread (never below 0)."""
        return max(0.0, self.between - self.within / self.launches_per_run)

    @property
    def spread(self) -> float:
        """The standard deviation of a run's mean (~ its relative drift)."""
        return math.sqrt(self.between)

    def describe(self) -> str:
        return (f"drift between runs {self.spread:.1%} pooled over {self.runs} runs of "
                f"{self.cases} case{'s' if self.cases != 1 else ''} on this machine "
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


__all__ = ["Drift", "case_components", "pooled"]
