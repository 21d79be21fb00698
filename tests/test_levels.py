"""The baseline verdict by runs (``verdict.levels``): a baseline of one run cannot tell a
difference from the machine's drift between sessions; several runs give that drift; a change
beyond doubt fails either way, from a single launch."""

from __future__ import annotations

import math
import random

import pytest

from pytest_dlperf.verdict import stats
from pytest_dlperf.verdict.levels import DOUBT_FACTOR, compare_runs, run_sizes
from pytest_dlperf.verdict.stats import INCONCLUSIVE, PASS, REGRESSION

# The one-run baseline: ResNet-50 1n1d, 3 launches at 32.5 / 33.3 / 32.9 images/s.
ONE_RUN = [[32.4, 32.5, 32.6], [33.2, 33.3, 33.4], [32.8, 32.9, 33.0]]


def launches_at(*medians: float, spread: float = 0.002) -> list[list[float]]:
    return [[m * (1 - spread), m, m * (1 + spread)] for m in medians]


def test_a_rerun_that_drifted_is_not_proven_a_regression_by_a_one_run_baseline() -> None:
    """The false alarm of issue 32: an unchanged rerun minutes later read 8% lower, its
    launches agreeing as closely as the baseline's; launches taken as exchangeable across runs
    call that a regression."""
    rerun = launches_at(30.3, 30.1, 30.4)
    assert stats.compare(rerun, ONE_RUN, 0.05).outcome == REGRESSION  # what the launches say
    verdict = compare_runs(rerun, ONE_RUN, [3], 0.05)
    assert verdict.outcome == INCONCLUSIVE and verdict.level == "one-run"
    assert not verdict.resolvable  # more launches of this run cannot tell drift from a change
    assert "recorded by one run, so the spread between runs is unknown" in verdict.evidence
    assert "--dlperf-update-baselines=add" in verdict.evidence
    assert "--dlperf-ab" in verdict.evidence
    within = compare_runs(launches_at(32.0, 32.3, 31.9), ONE_RUN, [3], 0.05)
    assert within.outcome == PASS and within.level == "one-run"


def test_a_drop_beyond_doubt_fails_from_a_one_run_baseline_after_one_launch() -> None:
    """Three CPU hogs: 0.23 images/s against a baseline of 28.2."""
    baseline = launches_at(28.1, 28.2, 28.3, spread=0.005)
    verdict = compare_runs([[0.23, 0.231, 0.229]], baseline, [3], 0.05,
                           alpha=stats.look_alpha(7))
    assert verdict.outcome == REGRESSION and verdict.beyond_doubt
    assert verdict.launches == 1
    assert "beyond a factor of 2" in verdict.evidence
    # The same drop where the launches disagree wildly is not proven from one launch.
    wild = compare_runs([[0.23]], [[28.2], [2.0], [300.0]], [3], 0.05)
    assert wild.outcome == INCONCLUSIVE and wild.resolvable
    # Just inside the factor: not beyond doubt, so drift cannot be ruled out.
    near = compare_runs(launches_at(28.2 / DOUBT_FACTOR * 1.01), baseline, [3], 0.05)
    assert near.outcome == INCONCLUSIVE and not near.beyond_doubt


def test_several_runs_give_the_drift_between_them() -> None:
    # Three runs of three launches; runs differ by ~8%, launches within a run by ~0.5%.
    baseline = launches_at(30.0, 30.1, 29.9) + launches_at(32.5, 32.6, 32.4) \
        + launches_at(31.2, 31.0, 31.1)
    runs = [3, 3, 3]
    drifted = compare_runs(launches_at(29.0, 29.1, 28.9), baseline, runs, 0.05)
    assert drifted.level == "runs" and drifted.baseline_runs == 3
    assert drifted.outcome == INCONCLUSIVE  # 7% below, within what runs drift by
    assert not drifted.resolvable  # the drift between runs dominates, not this run's launches
    assert drifted.spread == pytest.approx(0.04, abs=0.01)
    assert "between-run spread 4.0% over the baseline's 3 runs" in drifted.evidence
    # The same figures taken launch by launch prove a regression: windows of one run agree.
    assert stats.compare(launches_at(29.0, 29.1, 28.9), baseline, 0.05).outcome == REGRESSION
    # Runs that agree closely prove a smaller drop.
    steady = launches_at(31.0, 31.1, 30.9) + launches_at(31.2, 31.0, 31.1) \
        + launches_at(30.9, 31.0, 31.2)
    assert compare_runs(launches_at(27.0, 27.1, 26.9), steady, runs, 0.05).outcome == REGRESSION
    assert compare_runs(launches_at(31.0, 30.8, 31.1), steady, runs, 0.05).outcome == PASS


def test_a_noisy_run_is_resolvable_with_more_launches() -> None:
    steady = launches_at(31.0, 31.1, 30.9) + launches_at(31.2, 31.0, 31.1)
    noisy = compare_runs([[20.0], [36.0]], steady, [3, 3], 0.05)
    assert noisy.outcome == INCONCLUSIVE and noisy.resolvable


def test_runs_that_do_not_add_up_count_as_one_run() -> None:
    assert run_sizes([2, 3], 5) == [2, 3]
    assert run_sizes([2, 2], 5) == [5]  # a hand-edited file: its grouping is not trusted
    assert run_sizes([], 4) == [4] and run_sizes(None, 4) == [4]
    assert run_sizes([0, 4], 4) == [4]
    assert compare_runs(launches_at(30.0), ONE_RUN, [1, 1], 0.05).level == "one-run"


def test_false_regressions_under_drift_between_runs() -> None:
    """Unchanged reruns on a machine whose runs drift by 8% (launches within a run by 1%): the
    launch-level test cries wolf; from one run nothing is ever called a regression; from
    three runs the false alarms stay near the test's alpha."""
    rng = random.Random(32)

    def run(launches: int = 3) -> list[list[float]]:
        level = 30.0 * math.exp(rng.gauss(0, 0.08))
        return [[level * math.exp(rng.gauss(0, 0.01)) for _ in range(2)]
                for _ in range(launches)]

    trials = 1000
    flat = one = three = 0
    for _ in range(trials):
        base = [run(), run(), run()]
        rerun = run()
        flat += stats.compare(rerun, base[0], 0.05).outcome == REGRESSION
        one += compare_runs(rerun, base[0], [3], 0.05).outcome == REGRESSION
        three += compare_runs(rerun, [launch for r in base for launch in r], [3, 3, 3],
                              0.05).outcome == REGRESSION
    assert flat / trials > 0.15, flat  # what a one-run baseline did before runs counted
    assert one == 0
    assert three / trials <= 2 * stats.ALPHA, three
