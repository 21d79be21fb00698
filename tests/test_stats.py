from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_dlperf.stats import (IMPROVEMENT, INCONCLUSIVE, NO_BASELINE, PASS, REGRESSION,
                                 coefficient_of_variation, compare)

rates = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)
samples = st.lists(rates, min_size=1, max_size=15)
tolerances = st.floats(min_value=0.0, max_value=0.5)
# Multiplicative noise of at most a quarter of the tolerance ("low noise").
noise = st.lists(st.floats(-1.0, 1.0), min_size=3, max_size=15)

SLOW = settings(max_examples=60, deadline=None)  # each verdict bootstraps 2,000 resamples


@SLOW
@given(samples, tolerances)
def test_identical_samples_never_regress(values: list[float], tol: float) -> None:
    assert compare(values, values, tol).outcome == PASS


@SLOW
@given(rates, st.floats(0.01, 0.3), st.floats(2, 10), noise, noise, st.booleans())
def test_a_uniform_slowdown_of_k_tolerances_with_low_noise_regresses(
        base: float, tol: float, k: float, eps_base: list[float], eps_new: list[float],
        higher_is_better: bool) -> None:
    factor = max(1 - k * tol, 1e-3)
    baseline = [base * (1 + e * tol / 4) for e in eps_base]
    slower = [base * factor * (1 + e * tol / 4) for e in eps_new]
    if not higher_is_better:  # a step time or memory figure: worse is higher
        baseline, slower = [1 / v for v in baseline], [1 / v for v in slower]
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
    baseline = [base * (1 + e * tol / 4) for e in eps_base]
    faster = [base * (1 + k * tol) * (1 + e * tol / 4) for e in eps_new]
    assert compare(faster, baseline, tol).outcome == IMPROVEMENT


@SLOW
@given(samples, samples, tolerances, st.randoms(use_true_random=False))
def test_the_verdict_is_invariant_to_sample_order(new: list[float], old: list[float], tol: float,
                                                  rnd) -> None:  # type: ignore[no-untyped-def]
    shuffled_new, shuffled_old = rnd.sample(new, len(new)), rnd.sample(old, len(old))
    assert compare(new, old, tol) == compare(shuffled_new, shuffled_old, tol)


def test_a_drop_hidden_in_noise_is_inconclusive_not_a_regression() -> None:
    baseline = [10.0, 14.0, 9.0, 13.0, 10.5, 12.0, 9.5]
    noisy = [9.0, 13.5, 8.5, 12.5, 9.5, 11.0, 9.2]  # median -10%, but the spreads overlap
    verdict = compare(noisy, baseline, 0.05)
    assert verdict.outcome == INCONCLUSIVE
    assert verdict.p_worse is not None and verdict.p_worse > 0.01
    assert verdict.ratio_ci is not None and verdict.ratio_ci[1] > 0.95
    assert "7 vs 7 repeats, Mann-Whitney p=" in verdict.evidence


def test_a_clear_drop_reports_its_evidence() -> None:
    baseline = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 100.1]
    verdict = compare([v * 0.9 for v in baseline], baseline, 0.05)
    assert verdict.outcome == REGRESSION
    assert verdict.threshold == pytest.approx(100.1 * 0.95)
    assert verdict.delta == pytest.approx(-0.10)
    assert verdict.p_worse is not None and verdict.p_worse < 0.001
    assert verdict.ratio_ci == pytest.approx((0.89, 0.91), abs=0.01)
    data = verdict.to_json()
    assert data["outcome"] == REGRESSION and data["alpha"] == 0.01 and len(data["ratio_ci"]) == 2


def test_a_drop_within_tolerance_passes_even_when_significant() -> None:
    baseline = [100.0, 100.1, 99.9, 100.05, 99.95]
    assert compare([v * 0.98 for v in baseline], baseline, 0.05).outcome == PASS


def test_a_single_migrated_figure_is_judged_by_the_interval() -> None:
    # A schema-1 efficiency is one figure: the rank test cannot reach p < 0.01 on 5 vs 1, the
    # bootstrap interval of the measured side can.
    assert compare([0.40, 0.41, 0.39, 0.40, 0.40], [0.8], 0.05).outcome == REGRESSION
    assert compare([0.80, 0.81, 0.79, 0.80, 0.80], [0.8], 0.05).outcome == PASS
    assert compare([9.0], [10.0], 0.05).outcome == INCONCLUSIVE  # one vs one says nothing


def test_lower_is_better_metrics_regress_upwards() -> None:
    step_s = [0.100, 0.101, 0.099, 0.100, 0.102]
    assert compare([v * 1.2 for v in step_s], step_s, 0.05,
                   higher_is_better=False).outcome == REGRESSION
    assert compare([v * 0.8 for v in step_s], step_s, 0.05,
                   higher_is_better=False).outcome == IMPROVEMENT


def test_no_baseline() -> None:
    verdict = compare([10.0, 11.0], None, 0.05)
    assert verdict.outcome == NO_BASELINE and verdict.threshold is None and verdict.delta is None
    assert verdict.measured == 10.5


@pytest.mark.parametrize("tol", [-0.1, 1.0, 2.0])
def test_bad_tolerance(tol: float) -> None:
    with pytest.raises(ValueError, match="tolerance"):
        compare([1.0], [1.0], tol)


@pytest.mark.parametrize("bad", [[], [0.0], [-1.0, 2.0]])
def test_bad_samples(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="non-empty list of positive numbers"):
        compare(bad, [1.0], 0.05)


def test_coefficient_of_variation() -> None:
    assert coefficient_of_variation([10.0]) == 0.0
    assert coefficient_of_variation([9.0, 11.0]) == pytest.approx(2 ** 0.5 / 10)
