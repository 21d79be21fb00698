from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_dlperf.verdict.stats import (
    IMPROVEMENT,
    INCONCLUSIVE,
    NO_BASELINE,
    PASS,
    REGRESSION,
    coefficient_of_variation,
    compare,
    launch_medians,
)

rates = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)
launch = st.lists(rates, min_size=1, max_size=6)
runs = st.lists(launch, min_size=1, max_size=6)
tolerances = st.floats(min_value=0.0, max_value=0.5)
# Per-launch multiplicative noise of at most a quarter of the tolerance ("low noise").
noise = st.lists(st.floats(-1.0, 1.0), min_size=3, max_size=8)

SLOW = settings(max_examples=80, deadline=None)


def launches_at(level: float, eps: list[float], spread: float, windows: int = 3) -> list[list[float]]:
    """One launch per noise draw, each at ``level * (1 + eps * spread)``, its windows within
    0.1% of each other."""
    return [[level * (1 + e * spread) * (1 + 0.001 * (w - 1)) for w in range(windows)]
            for e in eps]


@SLOW
@given(runs, tolerances)
def test_identical_launches_never_regress(values: list[list[float]], tol: float) -> None:
    assert compare(values, values, tol).outcome == PASS


@SLOW
@given(rates, st.floats(0.01, 0.3), st.floats(2, 10), noise, noise, st.booleans())
def test_a_uniform_slowdown_of_k_tolerances_with_low_noise_regresses(
        base: float, tol: float, k: float, eps_base: list[float], eps_new: list[float],
        higher_is_better: bool) -> None:
    factor = max(1 - k * tol, 1e-3)
    baseline = launches_at(base, eps_base, tol / 4)
    slower = launches_at(base * factor, eps_new, tol / 4)
    if not higher_is_better:  # a step time or memory figure: worse is higher
        baseline = [[1 / v for v in launch] for launch in baseline]
        slower = [[1 / v for v in launch] for launch in slower]
    verdict = compare(slower, baseline, tol, higher_is_better=higher_is_better)
    assert verdict.outcome == REGRESSION, verdict
    assert verdict.delta is not None and verdict.threshold is not None
    if higher_is_better:
        assert verdict.measured < verdict.threshold
    else:
        assert verdict.measured > verdict.threshold


@SLOW
@given(st.floats(1, 1e3), st.floats(0.01, 0.3), st.floats(2, 10), noise, noise)
def test_a_uniform_speedup_with_low_noise_is_an_improvement(
        base: float, tol: float, k: float, eps_base: list[float], eps_new: list[float]) -> None:
    baseline = launches_at(base, eps_base, tol / 4)
    faster = launches_at(base * (1 + k * tol), eps_new, tol / 4)
    assert compare(faster, baseline, tol).outcome == IMPROVEMENT


@SLOW
@given(runs, runs, tolerances, st.randoms(use_true_random=False))
def test_the_verdict_is_invariant_to_launch_and_window_order(
        new: list[list[float]], old: list[list[float]], tol: float,
        rnd) -> None:  # type: ignore[no-untyped-def]
    def shuffle(launches: list[list[float]]) -> list[list[float]]:
        return rnd.sample([rnd.sample(w, len(w)) for w in launches], len(launches))

    assert compare(new, old, tol) == compare(shuffle(new), shuffle(old), tol)


def test_windows_that_agree_within_launches_do_not_prove_a_drop_between_them() -> None:
    # The defect this verdict fixes: windows of one launch agree to 0.1% while launches wander
    # by several percent. Counted as 15 independent samples a side, a -7% median looks proven
    # (every window of the run is below every baseline window but one); counted by launch it
    # is three launches against three, well within their spread.
    baseline = launches_at(100.0, [0.0, 0.08, -0.07], 1.0, windows=5)
    measured = launches_at(93.0, [0.0, 0.08, -0.07], 1.0, windows=5)
    verdict = compare(measured, baseline, 0.05)
    assert verdict.delta == pytest.approx(-0.07, abs=0.001)
    assert verdict.outcome == INCONCLUSIVE, verdict
    assert verdict.launches == verdict.baseline_launches == 3
    assert verdict.samples == verdict.baseline_samples == 15
    assert verdict.spread == pytest.approx(0.075, abs=0.01)
    assert verdict.p_worse is not None and verdict.p_worse > 0.01
    assert "3 vs 3 launches (15 vs 15 windows), between-launch spread 7." in verdict.evidence
    # The same drop with launches that agree is proven.
    steady = compare(launches_at(93.0, [0.0, 0.002, -0.002], 1.0),
                     launches_at(100.0, [0.0, 0.002, -0.002], 1.0), 0.05)
    assert steady.outcome == REGRESSION


def test_a_clear_drop_reports_its_evidence() -> None:
    baseline = launches_at(100.0, [0.0, 0.01, -0.01, 0.005], 1.0)
    verdict = compare([[v * 0.9 for v in launch] for launch in baseline], baseline, 0.05)
    assert verdict.outcome == REGRESSION
    assert verdict.threshold == pytest.approx(verdict.baseline * 0.95)
    assert verdict.delta == pytest.approx(-0.10)
    assert verdict.p_worse is not None and verdict.p_worse < 0.001
    assert verdict.ratio_ci is not None
    lo, hi = verdict.ratio_ci
    assert lo < 0.9 < hi and hi < 0.95
    # More launches a side, same spread: a narrower interval, a smaller detectable change.
    more = launches_at(100.0, [0.0, 0.01, -0.01, 0.005] * 3, 1.0)
    wider = compare([[v * 0.9 for v in launch] for launch in more], more, 0.05)
    assert wider.detectable is not None and verdict.detectable is not None
    assert 0 < wider.detectable < verdict.detectable < 0.1
    data = verdict.to_json()
    assert data["outcome"] == REGRESSION and data["alpha"] == 0.01 and len(data["ratio_ci"]) == 2


def test_a_drop_within_tolerance_passes_even_when_significant() -> None:
    baseline = launches_at(100.0, [0.0, 0.001, -0.001], 1.0)
    assert compare([[v * 0.98 for v in launch] for launch in baseline], baseline,
                   0.05).outcome == PASS


def test_one_launch_a_side_proves_nothing_and_says_why() -> None:
    verdict = compare([[90.0, 90.1, 89.9]], [[100.0, 100.1, 99.9]], 0.05)
    assert verdict.outcome == INCONCLUSIVE and verdict.spread is None
    assert verdict.p_worse is None and verdict.ratio_ci is None
    assert "the between-run spread is unknown" in verdict.evidence
    assert "--dlperf-launches 2" in verdict.evidence
    assert compare([[99.0]], [[100.0]], 0.05).outcome == PASS
    assert compare([[200.0]], [[100.0]], 0.05).outcome == PASS  # an unproven gain


def test_a_single_launch_baseline_is_judged_by_the_runs_own_spread() -> None:
    one = [[100.0, 100.2, 99.8, 100.1, 99.9]]  # a schema-2 baseline: one launch
    clear_drop = launches_at(70.0, [0.0, 0.005, -0.005], 1.0)
    verdict = compare(clear_drop, one, 0.05)
    assert verdict.outcome == REGRESSION and verdict.baseline_launches == 1
    assert compare(launches_at(100.0, [0.0, 0.005, -0.005], 1.0), one, 0.05).outcome == PASS


def test_lower_is_better_metrics_regress_upwards() -> None:
    step_s = launches_at(0.1, [0.0, 0.002, -0.002], 1.0)
    assert compare([[v * 1.2 for v in launch] for launch in step_s], step_s, 0.05,
                   higher_is_better=False).outcome == REGRESSION
    assert compare([[v * 0.8 for v in launch] for launch in step_s], step_s, 0.05,
                   higher_is_better=False).outcome == IMPROVEMENT


def test_no_baseline() -> None:
    verdict = compare([[10.0, 11.0], [12.0]], None, 0.05)
    assert verdict.outcome == NO_BASELINE and verdict.threshold is None and verdict.delta is None
    assert verdict.measured == pytest.approx(11.25)  # the median of the launch medians
    assert verdict.launches == 2 and verdict.samples == 3
    assert launch_medians([[10.0, 11.0], [12.0]]) == [10.5, 12.0]


@pytest.mark.parametrize("tol", [-0.1, 1.0, 2.0])
def test_bad_tolerance(tol: float) -> None:
    with pytest.raises(ValueError, match="tolerance"):
        compare([[1.0]], [[1.0]], tol)


@pytest.mark.parametrize("bad", [[], [[]], [[0.0]], [[-1.0, 2.0]], [[1.0], [float("nan")]]])
def test_bad_samples(bad: list[list[float]]) -> None:
    with pytest.raises(ValueError, match="positive numbers|at least one launch"):
        compare(bad, [[1.0]], 0.05)


def test_coefficient_of_variation() -> None:
    assert coefficient_of_variation([10.0]) == 0.0
    assert coefficient_of_variation([9.0, 11.0]) == pytest.approx(2 ** 0.5 / 10)


def test_add_mode_baselines_judge_like_any_other() -> None:
    """Launches of several recorded runs are just more launches: the spread they show is what
    the verdict pools."""
    runs = [launches_at(100.0 * (1 + drift), [0.0, 0.01], 1.0) for drift in (0.0, 0.04, -0.04)]
    baseline = [launch for run in runs for launch in run]
    verdict = compare(launches_at(93.0, [0.0, 0.01], 1.0), baseline, 0.05)
    assert verdict.baseline_launches == 6 and verdict.spread is not None
    assert verdict.spread > 0.02  # the runs' drift is in the spread, not hidden


def test_launches_too_far_apart_for_any_interval_give_a_verdict_not_an_overflow() -> None:
    # A judging run on a machine that stalled one launch of the baseline's two 20x (seen here
    # beside another job's spinning threads): one degree of freedom, at one look's share of
    # ALPHA, puts the interval's ends past e^709, where exp overflows.
    verdict = compare([[540.0, 541.0]], [[500.0, 501.0], [11000.0, 11010.0]], 0.05,
                      alpha=0.0005)
    assert verdict.outcome == INCONCLUSIVE
    assert verdict.ratio_ci is not None
    lo, hi = verdict.ratio_ci
    assert 0 <= lo < 1e-300 and 1e300 < hi < float("inf")  # unbounded, and still a number
    assert verdict.to_json()["ratio_ci"] == [lo, hi]
