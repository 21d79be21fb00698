"""The A/B verdict on numbers alone (``verdict.paired``): pairs of launches, head against base."""

from __future__ import annotations

import itertools
import math

import pytest

from pytest_dlperf.verdict import paired
from pytest_dlperf.verdict.stats import IMPROVEMENT, INCONCLUSIVE, PASS, REGRESSION, compare

# The machine's speed in successive pairs: drifting down by a third over the run, as this VM
# did between sessions minutes apart.
DRIFT = [1.00, 0.93, 0.86, 0.80, 0.74, 0.70]
# Within a pair the two launches still differ a little (+-1%), in no fixed direction.
JITTER = [(1.00, 1.01), (1.01, 0.99), (0.995, 1.005), (1.0, 0.99), (1.008, 1.0), (0.99, 1.0)]


def pairs_for(ratio: float, n: int = 6, level: float = 100.0) -> list[tuple[list[float],
                                                                               list[float]]]:
    """``n`` pairs whose head runs at ``ratio`` x the base, under the drift and the jitter;
    two windows a launch."""
    made = []
    for speed, (jb, jh) in zip(DRIFT[:n], JITTER[:n]):
        base = level * speed * jb
        head = level * speed * jh * ratio
        made.append(([base, base * 1.002], [head, head * 0.998]))
    return made


def test_a_head_slower_by_15_percent_is_a_regression_whatever_the_drift() -> None:
    v = paired.paired_compare(pairs_for(0.85), 0.05)
    assert v.outcome == REGRESSION
    lo, hi = v.ratio_ci
    assert lo < 0.85 < hi < 0.95
    assert v.launches == v.baseline_launches == 6


def test_the_same_code_passes_under_a_drift_that_fools_the_unpaired_test() -> None:
    """The point of pairing: the same launches judged as two unpaired samples see the drift
    (the base's launches happen to come earlier in each pair half the time, but the spread
    is what the drift makes it)."""
    same = pairs_for(1.0)
    v = paired.paired_compare(same, 0.05)
    assert v.outcome == PASS
    lo, hi = v.ratio_ci
    assert lo < 1.0 < hi and hi - lo < 0.05
    # Unpaired, the drift's 30% spread leaves the interval ten times wider.
    unpaired = compare([h for _, h in same], [b for b, _ in same], 0.05)
    assert unpaired.ratio_ci is not None
    assert (unpaired.ratio_ci[1] - unpaired.ratio_ci[0]) > 5 * (hi - lo)


def test_a_faster_head_is_an_improvement_and_a_small_change_within_tolerance_passes() -> None:
    assert paired.paired_compare(pairs_for(1.15), 0.05).outcome == IMPROVEMENT
    assert paired.paired_compare(pairs_for(0.98), 0.05).outcome == PASS
    # ... and fails when the tolerance is below it
    assert paired.paired_compare(pairs_for(0.96), 0.02).outcome == REGRESSION


def test_beyond_the_tolerance_without_evidence_is_inconclusive() -> None:
    # one pair: no spread between pairs
    one = paired.paired_compare(pairs_for(0.8, n=1), 0.05)
    assert one.outcome == INCONCLUSIVE and one.ratio_ci is None
    # ... and within it: one pair rules nothing out (issue 52)
    assert paired.paired_compare(pairs_for(1.0, n=1), 0.05).outcome == INCONCLUSIVE
    # pairs that disagree wildly: a mean 10% down that the pairs do not prove
    wild = [([100.0], [60.0]), ([100.0], [125.0]), ([100.0], [86.0])]
    assert paired.paired_compare(wild, 0.05).outcome == INCONCLUSIVE


def test_the_verdict_does_not_depend_on_the_order_of_the_pairs() -> None:
    made = pairs_for(0.9)
    outcomes = {(v.outcome, round(v.p_worse or 0, 12), v.ratio_ci and round(v.ratio_ci[0], 12))
                for order in itertools.islice(itertools.permutations(made), 24)
                for v in [paired.paired_compare(list(order), 0.05)]}
    assert len(outcomes) == 1


def test_pairs_alternate_which_side_goes_first() -> None:
    assert [paired.order(i) for i in range(4)] == [("base", "head"), ("head", "base"),
                                                   ("base", "head"), ("head", "base")]


@pytest.mark.parametrize("pairs, tolerance", [([], 0.05), (pairs_for(1.0), 1.5),
                                              ([([0.0], [1.0])], 0.05)])
def test_bad_input_says_what_is_wrong(pairs: list, tolerance: float) -> None:
    with pytest.raises(ValueError):
        paired.paired_compare(pairs, tolerance)


def test_an_improvement_not_yet_proven_asks_for_more_pairs_and_stays_a_pass() -> None:
    """Three pairs of a ~3x faster head, one of them odd (7.9x: its base launch read low): the
    interval is too wide to prove the improvement, yet rules out a slowdown, so it passes, and
    the A/B loop is told to add pairs; a change within the tolerance, proven or not, and a
    regression, are not."""
    odd = [([10_236.0], [81_261.0]), ([15_219.0], [44_641.0]), ([15_668.0], [43_357.0])]
    unproven = paired.paired_compare(odd, 0.05, alpha=0.0014)
    assert unproven.outcome == PASS and paired.wants_more_pairs(unproven)
    assert not paired.wants_more_pairs(paired.paired_compare(pairs_for(1.15), 0.05))  # proven
    assert not paired.wants_more_pairs(paired.paired_compare(pairs_for(1.02), 0.05))
    assert not paired.wants_more_pairs(paired.paired_compare(pairs_for(0.85), 0.05))
    wild = [([100.0], [60.0]), ([100.0], [125.0]), ([100.0], [86.0])]
    assert paired.wants_more_pairs(paired.paired_compare(wild, 0.05))  # inconclusive


# -- the signed-rank test beside the t-test, more pairs for a one-sided slowdown, duet ---------

# What a busy machine did to a ~4.6x slower head (issue 39): every pair slower, the pairs'
# ratios scattered over a decade by another job on both cores.
BUSY = [0.05, 0.60, 0.12, 0.45, 0.08, 0.70, 0.15, 0.35, 0.04, 0.55, 0.20, 0.30]


def ratios(values: list[float]) -> list[tuple[list[float], list[float]]]:
    return [([100.0], [100.0 * r]) for r in values]


def test_one_wild_pair_cannot_hide_a_slowdown_every_pair_shows() -> None:
    """Eleven pairs ~20% slower and one far slower still: the t-test's spread is the wild
    pair's, its interval reaches past 1; the signed-rank test sees twelve pairs of twelve on the
    slow side (exact p = 1/4096) and proves it. Each test runs at its share of alpha: the
    signed-rank test at most alpha/2."""
    made = ratios([0.80, 0.79, 0.81, 0.80, 0.82, 0.78, 0.80, 0.81, 0.79, 0.80, 0.80, 0.0005])
    v = paired.paired_compare(made, 0.05, alpha=0.0025)
    assert v.outcome == REGRESSION
    t_only, signed_rank = paired.p_values(*paired.one_sample(paired.log_ratios(made)))
    assert t_only[0] > 0.0025 / 2  # the t-test alone would not prove it
    assert signed_rank[0] == pytest.approx(1 / 4096)
    share = paired.signed_rank_level(12, 0.0025)
    assert 1 / 4096 <= share <= 0.0025 / 2
    assert v.p_worse == pytest.approx(1 / 4096 * 0.0025 / share)


def test_the_signed_rank_test_takes_only_the_alpha_it_can_use() -> None:
    """Its exact p-values are discrete: with 3 or 6 pairs none lies within alpha/2 and the
    t-test keeps all of alpha, as before the signed-rank test; with 12 it takes what it
    attains within alpha/2 (checked against scipy's exact distribution)."""
    from scipy.stats import wilcoxon

    assert paired.signed_rank_level(3, 0.005) == paired.signed_rank_level(6, 0.0025) == 0
    assert paired.signed_rank_level(12, 0.0025) == pytest.approx(5 / 4096)  # W+ <= 3
    assert wilcoxon([-1, -2, 3, -4, -5, -6, -7, -8, -9, -10, -11, -12],
                    alternative="less").pvalue == pytest.approx(5 / 4096)
    three = paired.paired_compare(pairs_for(0.85, n=3), 0.05, alpha=0.005)
    t_only = paired.p_values(*paired.one_sample(paired.log_ratios(pairs_for(0.85, n=3))))[0][0]
    assert three.p_worse == pytest.approx(t_only)


def test_the_busy_machine_case_is_inconclusive_at_six_pairs_and_a_regression_at_the_limit() -> None:
    """Six pairs, all slower: the signed-rank's exact p is 1/64, nothing at alpha/2 can be
    proven; the run is told to add pairs up to PAIR_LIMIT, where it is a regression."""
    six = paired.paired_compare(ratios(BUSY[:6]), 0.05, alpha=0.0025)
    assert six.outcome == INCONCLUSIVE
    assert paired.p_values(*paired.one_sample(paired.log_ratios(ratios(BUSY[:6]))))[1][0] == pytest.approx(1 / 64)
    assert paired.PAIR_LIMIT == 12
    assert paired.more_pairs(six, ratios(BUSY[:6])) == 6
    twelve = paired.paired_compare(ratios(BUSY), 0.05, alpha=0.0025)
    assert twelve.outcome == REGRESSION
    assert paired.more_pairs(twelve, ratios(BUSY)) == 0


def test_no_extra_pairs_when_the_pairs_disagree_or_the_limit_is_reached() -> None:
    wild = ratios([0.6, 1.25, 0.86])
    v = paired.paired_compare(wild, 0.05)
    assert v.outcome == INCONCLUSIVE and paired.more_pairs(v, wild) == 0  # one pair faster
    at_limit = ratios(BUSY[:6] * 2)
    unsure = paired.paired_compare(ratios([0.05, 0.9]), 0.05)
    assert unsure.outcome == INCONCLUSIVE
    assert paired.more_pairs(unsure, at_limit) == 0


def test_the_looks_count_the_extra_look_at_the_pair_limit() -> None:
    """Bonferroni over every look the run may take: its rounds of pairs, and the one look at
    PAIR_LIMIT pairs when a slowdown stays one-sided."""
    assert paired.looks(per_round=3, most=6) == 3
    assert paired.looks(per_round=3, most=3) == 2
    assert paired.looks(per_round=3, most=12) == 4  # the limit is a look of its own already
    assert paired.looks(per_round=4, most=16) == 4  # beyond the limit: no extension


def test_the_pair_limit_proves_a_one_sided_slowdown_at_every_alpha_a_run_uses() -> None:
    """All PAIR_LIMIT pairs on one side: exact p = 2^-12, below alpha/2 for runs of up to
    twenty looks (alpha = 0.01 / 20)."""
    assert 2 ** -paired.PAIR_LIMIT < (0.01 / 20) / 2


def test_duet_judges_each_launch_on_its_windows_ratios() -> None:
    """In duet the two sides' window k cover the same wall time: a launch's figure is the mean
    of its windows' log ratios, not the ratio of the sides' medians."""
    duet = [([100.0, 50.0], [80.0, 50.0])] * 3
    assert paired.log_ratios(duet, per_window=True) == [pytest.approx(math.log(0.8) / 2)] * 3
    assert paired.log_ratios(duet) == [pytest.approx(math.log(65 / 75))] * 3
    v = paired.paired_compare(duet, 0.05, per_window=True)
    assert paired.ratio(v) == pytest.approx(math.sqrt(0.8))
    with pytest.raises(ValueError, match="windows"):
        paired.log_ratios([([100.0, 50.0], [80.0])], per_window=True)


def test_duet_takes_the_halves_own_speed_out_of_the_verdict() -> None:
    """Issue 39's duet collection on this VM: with the same code on both sides, launches with
    the base on half A read head/base ~1.02 and those with it on half B ~0.97 (core 0 takes
    the interrupts). The swap cancels that in the mean, the verdict's spread must not count it
    as noise, and an unchanged head must pass."""
    alternating = [1.02, 0.97, 1.021, 0.972, 1.018, 0.969]
    same = [([100.0] * 3, [100.0 * r] * 3) for r in alternating]
    test, corrected = paired.one_sample(paired.log_ratios(same, per_window=True), halves=True)
    assert test.df == len(alternating) - 2
    assert test.spread < 0.005  # what is left once the halves' difference is out
    assert max(corrected) - min(corrected) < 0.01
    naive, _ = paired.one_sample(paired.log_ratios(same, per_window=True))
    assert naive.spread > 0.02  # the halves' difference taken for noise
    assert paired.paired_compare(same, 0.02, per_window=True).outcome == PASS
    slower = [([100.0] * 3, [100.0 * r * 0.95] * 3) for r in alternating]
    assert paired.paired_compare(slower, 0.02, per_window=True).outcome == REGRESSION


def test_a_pass_needs_an_interval_that_rules_out_a_regression_beyond_the_tolerance() -> None:
    """Issue 52: three duet pairs of a head ~12.5% slower passed at 0.966 on [0.000, 13009.863]
    (duet takes the halves' difference out: one degree of freedom from three pairs). Within
    the tolerance without that evidence (a slowdown beyond it not ruled out at 95%, one-sided)
    is inconclusive, and the A/B loop adds pairs."""
    three = [([100.0] * 4, [100.0 * r] * 4) for r in (0.80, 1.17, 0.97)]
    v = paired.paired_compare(three, 0.05, per_window=True)
    assert v.ratio_ci is not None and v.ratio_ci[0] < 0.5 and 0.95 < paired.ratio(v) < 1.05
    assert v.outcome == INCONCLUSIVE and paired.wants_more_pairs(v)
    # The same pairs' figures, steady: the interval within the tolerance, a pass.
    steady = [([100.0] * 4, [100.0 * r] * 4) for r in (0.99, 1.0, 0.995, 1.005, 0.99, 1.0)]
    assert paired.paired_compare(steady, 0.05, per_window=True).outcome == PASS
