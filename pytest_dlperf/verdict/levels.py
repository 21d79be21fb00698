"""The baseline verdict one level up: **runs**.

Evidence comes in three levels: windows within launches within runs (a run is one pytest
session). ``stats.compare`` takes the launches of both sides as exchangeable, which holds within
one run; between runs minutes apart this project's CPU VMs drift by tens of percent (an
unchanged case came out 11-39% slower, every launch of the later run below every launch of the
first), far more than launches of one run differ. A t-test on launches then proves a
"regression" that is the machine's drift. So the baseline's launches are grouped by the runs
that recorded them (``Baseline.runs``) and the verdict asks the level the baseline can answer:

- **Several runs** (``level="runs"``): this run's mean log launch median against the baseline's
  runs' means; the between-run spread is their standard deviation, with ``runs - 1`` degrees of
  freedom. This run's mean is one draw of a run: the drift between runs (what the run means
  vary by beyond their launches' own spread) plus its launches' spread over their number.
  Extra launches help only while that last term is the larger (``resolvable``): past that, the
  drift between runs dominates and more launches of this run cannot shrink it.
- **One run** (``level="one-run"``): the between-run spread is unknown. A difference beyond the
  tolerance that could be drift is **inconclusive**, and no extra launch can change that (the
  message says how: add runs with ``--dlperf-update-baselines=add``, or judge head against base
  with ``--dlperf-ab``).

At every level a change **beyond doubt** (beyond a factor of ``DOUBT_FACTOR``, the most a run
on an unchanged machine has drifted here is ~1.4x) is judged on the launches alone, so a CPU hog
(-90% and worse) fails from a one-run baseline, and after one or two launches (the caller judges
after every launch, ``look_alpha`` splitting ALPHA over the looks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from ..core.protocol import split
from .stats import (
    ALPHA,
    DOUBT_FACTOR,
    INCONCLUSIVE,
    PASS,
    Launches,
    TTest,
    Verdict,
    compare,
    decide_outcome,
    launch_medians,
)


def run_sizes(runs: Sequence[int] | None, launches: int) -> list[int]:
    """The baseline's launches per run, oldest first; one run of all of them where the
    baseline does not say (hand-written, or its runs do not add up to its launches)."""
    sizes = [int(n) for n in runs or []]
    if not sizes or sum(sizes) != launches or min(sizes) < 1:
        return [launches]
    return sizes


def compare_runs(launches: Launches, baseline: Launches | None, runs: Sequence[int] | None,
                 tolerance: float, *, higher_is_better: bool = True,
                 alpha: float = ALPHA) -> Verdict:
    """Judge this run's ``launches`` against the ``baseline``'s, whose launches came from
    runs of ``runs`` launches each (oldest first)."""
    flat = compare(launches, baseline, tolerance, higher_is_better=higher_is_better, alpha=alpha)
    if baseline is None or flat.baseline is None:
        return flat
    sizes = run_sizes(runs, len(baseline))
    good = flat.measured / flat.baseline
    good = good if higher_is_better else 1 / good
    if good < 1 / DOUBT_FACTOR or good > DOUBT_FACTOR:  # the launches alone can settle it
        return replace(flat, level="launches", baseline_runs=len(sizes), beyond_doubt=True)
    if len(sizes) == 1:
        return _one_run(flat, good, tolerance)
    return _between_runs(launches, baseline, sizes, flat, good, tolerance, alpha)


def _one_run(flat: Verdict, good: float, tolerance: float) -> Verdict:
    """From a one-run baseline: within the tolerance is a pass; beyond it, drift cannot be
    ruled out, whatever the launches say."""
    outcome = INCONCLUSIVE if good < 1 - tolerance else PASS
    return replace(flat, outcome=outcome, level="one-run", baseline_runs=1, resolvable=False)


def _between_runs(launches: Launches, baseline: Launches, sizes: list[int], flat: Verdict,
                  good: float, tolerance: float, alpha: float) -> Verdict:
    logs = [math.log(v) for v in launch_medians(launches)]
    groups = split([math.log(v) for v in launch_medians(baseline)], sizes)
    means = [math.fsum(g) / len(g) for g in groups]
    runs = len(means)
    grand = math.fsum(means) / runs
    between = math.fsum((m - grand) ** 2 for m in means) / (runs - 1)  # variance of run means
    within = _within_variance([logs, *groups])  # of launches around their run's mean
    n = len(logs)
    typical = len(baseline) / runs  # launches of a baseline run
    drift = max(0.0, between - within / typical)  # what runs add to launches' own spread
    se = math.sqrt(max(between, within / typical) / runs + drift + within / n)
    test = TTest(math.fsum(logs) / n - grand, se, runs - 1, math.sqrt(between))
    p_worse, p_better = ((test.p_less, test.p_greater) if flat.higher_is_better
                         else (test.p_greater, test.p_less))
    lo, hi = (math.exp(bound) for bound in test.interval(alpha))
    outcome = decide_outcome(good, tolerance, p_worse, p_better, alpha)
    return replace(flat, outcome=outcome, p_worse=p_worse, p_better=p_better, ratio_ci=(lo, hi),
                   spread=test.spread, level="runs", baseline_runs=runs,
                   resolvable=within / n > drift)


def _within_variance(groups: Sequence[Sequence[float]]) -> float:
    """The pooled variance of launches around their run's mean (0 where no run has two)."""
    ss = math.fsum((v - math.fsum(g) / len(g)) ** 2 for g in groups for v in g)
    df = sum(len(g) - 1 for g in groups)
    return ss / df if df > 0 else 0.0


__all__ = ["DOUBT_FACTOR", "compare_runs", "run_sizes"]
