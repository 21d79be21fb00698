"""The baseline verdict one level up: **runs**.

Evidence comes in three levels: windows within launches within runs (a run is one pytest
session). ``stats.compare`` takes the launches of both sides as exchangeable, which holds within
one run; between runs minutes apart this project's CPU VMs drift by tens of percent (an
unchanged case came out 11-39% slower, every launch of the later run below every launch of the
first), far more than launches of one run differ. A t-test on launches then proves a
"regression" that is the machine's drift. So the baseline's launches are grouped by the runs
that recorded them (``Baseline.runs``) and the verdict compares this run's mean log launch
median with the baseline's runs' mean, the difference's uncertainty being the drift between
runs (over the baseline's runs, and once for this run) plus the launches' own noise:

- **By the machine** (``level="machine"``): the drift between runs pooled over every case of
  the machine's baselines (``drift``), with as many degrees of freedom as those cases' runs
  give; a one-run baseline is judged so too (weaker: its one run's drift is not averaged out).
- **By the case's own runs** (``level="runs"``): where the machine has no better estimate, or
  this case's runs drift significantly more than the machine's (``choose_model``).
- **By the history** (``level="history"``): where no baseline of the machine holds two runs,
  the drift between nights pooled over every case of its history (``--dlperf-history``;
  ``drift.from_history``), judged as by the machine's.
- **One run, nothing pooled** (``level="one-run"``): the drift is unknown. A difference beyond
  the tolerance that could be drift is **inconclusive**, and no extra launch can change that
  (the message says how: add runs with ``--dlperf-update-baselines=add``, or judge head against
  base with ``--dlperf-ab``).

**A drop far beyond the runner's drift fails from any baseline** (``beyond_bound``): a drop
beyond the tolerance that the level's test leaves unproven is a regression where the launches
prove it beyond a bound of what runs drift (a one-sided t-test on the log launch medians, as
``stats.compare``'s, against the ratio ``1 / bound``): ``DRIFT_BOUND`` (1.5x; an unchanged case
here drifted 1.39x at most) where nothing measured the drift or what was measured is smaller,
else ``DRIFT_Z`` standard deviations of the difference the level's drift gives between this run
and the baseline's mean. So -47% fails against a one-night baseline, and against a two-night one
whose single degree of freedom leaves Student's t at ~64; a drop within the bound stays
inconclusive. More launches can prove it, so such a verdict is resolvable while its median is
beyond the bound.

Extra launches help only while this run's launches' noise is the larger term (``resolvable``):
past that, the drift between runs dominates and more launches of this run cannot shrink it.

At every level a change **beyond doubt** (beyond a factor of ``DOUBT_FACTOR``, the most a run
on an unchanged machine has drifted here is ~1.4x) is judged on the launches alone, so a drop
of -90% fails from a one-run baseline, and after one or two launches (the caller judges after
every launch, ``look_alpha`` spending ALPHA over the looks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from .drift import Drift, case_components, pooled
from .stats import (
    ALPHA,
    DOUBT_FACTOR,
    DRIFT_BOUND,
    DRIFT_Z,
    INCONCLUSIVE,
    PASS,
    REGRESSION,
    Launches,
    TTest,
    Verdict,
    compare,
    decide_outcome,
    launch_medians,
    pooled_t_test,
)


def run_sizes(runs: Sequence[int] | None, launches: int) -> list[int]:
    """The baseline's launches per run, oldest first; one run of all of them where the
    baseline does not say (hand-written, or its runs do not add up to its launches)."""
    sizes = [int(n) for n in runs or []]
    if not sizes or sum(sizes) != launches or min(sizes) < 1:
        return [launches]
    return sizes


def compare_runs(launches: Launches, baseline: Launches | None, runs: Sequence[int] | None,
                 tolerance: float, *, higher_is_better: bool = True, alpha: float = ALPHA,
                 drift: Drift | None = None) -> Verdict:
    """Judge this run's ``launches`` against the ``baseline``'s, whose launches came from
    runs of ``runs`` launches each (oldest first); ``drift``: the machine's drift between
    runs pooled over its baselines (``drift``), or over its history's nights where no baseline
    of it has two runs (``drift.from_history``), None where neither gives one."""
    flat = compare(launches, baseline, tolerance, higher_is_better=higher_is_better, alpha=alpha)
    if baseline is None or flat.baseline is None:
        return flat
    sizes = run_sizes(runs, len(baseline))
    good = flat.measured / flat.baseline
    good = good if higher_is_better else 1 / good
    if good < 1 / DOUBT_FACTOR or good > DOUBT_FACTOR:  # the launches alone can settle it
        return replace(flat, level="launches", baseline_runs=len(sizes), beyond_doubt=True)
    model, level = choose_model(baseline, sizes, drift)
    judged = (_one_run(flat, good, tolerance) if model is None else
              _between_runs(launches, baseline, sizes, flat, good, tolerance, alpha, model, level))
    return beyond_bound(judged, launches, baseline, good, *drift_bound(model, len(sizes)))


def drift_bound(model: Drift | None, runs: int) -> tuple[float, str]:
    """The most this run is taken to drift from the mean of the baseline's ``runs`` runs on an
    unchanged machine, as a factor, and where it came from: ``DRIFT_BOUND`` ("default") where
    no drift was measured, or the measured one reads less (one or two degrees of freedom can
    read far below the machine's drift); else ``DRIFT_Z`` standard deviations of the difference
    the ``model`` gives ("drift")."""
    if model is None:
        return DRIFT_BOUND, "default"
    measured = math.exp(DRIFT_Z * math.sqrt(model.between * (1 + 1 / runs)))
    return (measured, "drift") if measured > DRIFT_BOUND else (DRIFT_BOUND, "default")


def beyond_bound(verdict: Verdict, launches: Launches, baseline: Launches, good: float,
                 bound: float, source: str) -> Verdict:
    """An inconclusive ``verdict`` (worse beyond the tolerance, unproven by its level) is a
    regression where the launches prove the change worse than ``bound`` (a one-sided pooled
    t-test of the log launch medians against ``log(bound)``, at the verdict's alpha); else it
    stays inconclusive, resolvable by more launches while its median is beyond the bound.
    Beyond ``DOUBT_FACTOR`` the launches judge already (``compare_runs``)."""
    if verdict.outcome != INCONCLUSIVE or bound >= DOUBT_FACTOR:
        return verdict
    test = pooled_t_test([math.log(v) for v in launch_medians(launches)],
                         [math.log(v) for v in launch_medians(baseline)])
    p = None
    if test is not None:  # None: one launch a side
        shift = math.log(bound) if verdict.higher_is_better else -math.log(bound)
        moved = replace(test, diff=test.diff + shift)
        p = moved.p_less if verdict.higher_is_better else moved.p_greater
    found = replace(verdict, bound=bound, bound_from=source, bound_p=p)
    if p is not None and p < verdict.alpha:
        return replace(found, outcome=REGRESSION, beyond_bound=True, resolvable=False)
    return replace(found, resolvable=verdict.resolvable or good < 1 / bound)


def choose_model(baseline: Launches, sizes: list[int], drift: Drift | None
                 ) -> tuple[Drift | None, str]:
    """The drift model the verdict uses: the machine's pooled one where it has more degrees of
    freedom than the case's own runs, unless this case's runs drift significantly more than the
    machine's (an F-test at 1%: it is then judged by its own, the more cautious); the case's own
    where the machine has none better; None for a one-run baseline of a machine without a
    pooled drift."""
    own = pooled([(baseline, sizes)]) if len(sizes) > 1 else None
    if drift is None or (own is not None and own.between_df >= drift.between_df):
        return own, "runs"
    if own is not None and own.between > drift.between:
        from scipy.stats import f as fisher

        excess = own.between / drift.between if drift.between > 0 else math.inf
        if excess > float(fisher.ppf(0.99, own.between_df, drift.between_df)):
            return own, "runs"
    return drift, "history" if drift.source else "machine"


def _one_run(flat: Verdict, good: float, tolerance: float) -> Verdict:
    """From a one-run baseline on a machine without a pooled drift: within the tolerance is a
    pass; beyond it, drift cannot be ruled out, whatever the launches say."""
    outcome = INCONCLUSIVE if good < 1 - tolerance else PASS
    return replace(flat, outcome=outcome, level="one-run", baseline_runs=1, resolvable=False)


def _between_runs(launches: Launches, baseline: Launches, sizes: list[int], flat: Verdict,
                  good: float, tolerance: float, alpha: float, model: Drift,
                  level: str) -> Verdict:
    """This run's mean log launch median against the baseline's runs' mean: the baseline's
    mean carries the drift of its runs over their number, this run's mean one run's drift
    (the model's, and never less than a run mean's own noise), and both their launches' noise
    (this case's own, pooled over its runs and this run, where it has any; else the
    machine's)."""
    logs = [math.log(v) for v in launch_medians(launches)]
    means, ss, df = case_components(baseline, sizes)
    recorded = ss / df if df > 0 else model.within  # the baseline's own launches' noise
    n = len(logs)
    mine = math.fsum(logs) / n
    ss += math.fsum((v - mine) ** 2 for v in logs)
    df += n - 1
    within = ss / df if df > 0 else model.within
    runs = len(means)
    grand = math.fsum(means) / runs
    # Runs drift at least as much as the mean of a run's launches varies: where the runs of the
    # pool agree better than that, the pool happened to see the machine in one state (a slow
    # run in 14 read 8-13% low for every case here, which a drift of 2% called a regression).
    drift = max(model.run_variance, recorded / model.launches_per_run)
    base_var = drift / runs + within * math.fsum(1 / size for size in sizes) / runs ** 2
    se = math.sqrt(base_var + drift + within / n)
    test = TTest(mine - grand, se, model.between_df, math.sqrt(drift + within / (n or 1)))
    p_worse, p_better = ((test.p_less, test.p_greater) if flat.higher_is_better
                         else (test.p_greater, test.p_less))
    lo, hi = test.ratio_interval(alpha)
    outcome = decide_outcome(good, tolerance, p_worse, p_better, alpha)
    return replace(flat, outcome=outcome, p_worse=p_worse, p_better=p_better, ratio_ci=(lo, hi),
                   spread=test.spread, level=level, baseline_runs=runs,
                   resolvable=within / n > drift,
                   drift=model.describe() if level != "runs" else None)


__all__ = ["DOUBT_FACTOR", "DRIFT_BOUND", "beyond_bound", "choose_model", "compare_runs",
           "drift_bound", "run_sizes"]
