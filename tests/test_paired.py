"""The A/B verdict on numbers alone (``verdict.paired``): pairs of launches, head against base."""

from __future__ import annotations

import itertools

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
    assert paired.paired_compare(pairs_for(1.0, n=1), 0.05).outcome == PASS
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
    interval is too wide to prove the improvement, so it passes, and the A/B loop is told to
    add pairs; a change within the tolerance, proven or not, and a regression, are not."""
    odd = [([10_236.0], [81_261.0]), ([15_219.0], [44_641.0]), ([15_668.0], [43_357.0])]
    unproven = paired.paired_compare(odd, 0.05, alpha=0.0014)
    assert unproven.outcome == PASS and paired.wants_more_pairs(unproven)
    assert not paired.wants_more_pairs(paired.paired_compare(pairs_for(1.15), 0.05))  # proven
    assert not paired.wants_more_pairs(paired.paired_compare(pairs_for(1.02), 0.05))
    assert not paired.wants_more_pairs(paired.paired_compare(pairs_for(0.85), 0.05))
    wild = [([100.0], [60.0]), ([100.0], [125.0]), ([100.0], [86.0])]
    assert paired.wants_more_pairs(paired.paired_compare(wild, 0.05))  # inconclusive
