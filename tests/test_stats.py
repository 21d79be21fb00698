from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_dlperf.stats import IMPROVEMENT, NO_BASELINE, PASS, REGRESSION, compare

rates = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)
tolerances = st.floats(min_value=0.0, max_value=0.5)


@given(rates, tolerances)
def test_identical_figures_pass(rate: float, tol: float) -> None:
    assert compare(rate, rate, tol).outcome == PASS


@given(rates, st.floats(0.01, 0.5), st.floats(1.01, 10))
def test_a_drop_beyond_tolerance_regresses(base: float, tol: float, k: float) -> None:
    verdict = compare(base * (1 - tol * k) if tol * k < 1 else base * 0.001, base, tol)
    assert verdict.outcome == REGRESSION
    assert verdict.measured < verdict.threshold  # type: ignore[operator]


@given(rates, st.floats(0.01, 0.5), st.floats(1.01, 10))
def test_a_gain_beyond_tolerance_is_an_improvement(base: float, tol: float, k: float) -> None:
    assert compare(base * (1 + tol * k), base, tol).outcome == IMPROVEMENT


def test_the_verdict_reports_threshold_and_delta() -> None:
    verdict = compare(90.0, 100.0, 0.05)
    assert verdict.outcome == REGRESSION
    assert verdict.threshold == pytest.approx(95.0)
    assert verdict.delta == pytest.approx(-0.10)
    assert compare(96.0, 100.0, 0.05).outcome == PASS


def test_no_baseline() -> None:
    verdict = compare(10.0, None, 0.05)
    assert verdict.outcome == NO_BASELINE and verdict.threshold is None and verdict.delta is None


@pytest.mark.parametrize("tol", [-0.1, 1.0, 2.0])
def test_bad_tolerance(tol: float) -> None:
    with pytest.raises(ValueError, match="tolerance"):
        compare(1.0, 1.0, tol)
