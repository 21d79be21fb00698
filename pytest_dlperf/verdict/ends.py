"""A bisect probe against both ends of the range (``dlperf bisect``): GOOD's level (1: every probe
is an A/B run against GOOD) and the slow end's (BAD's, measured, with its own error). A probe is
classed by which end its pairs rule out, each end tested one-sided: **not slow** where it rules
out the slow end and not 1, **slow** where it rules out 1 and not the slow end, the nearer end on
a log scale where it rules out both (a partial slowdown), **inconclusive** where neither (the
search takes more pairs, then guesses, saying how likely its guess is: each end's likelihood of
the probe's reading, even odds before). Pure functions of the pairs' figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import paired
from .stats import ALPHA

SLOW, NOT_SLOW, INCONCLUSIVE = "slow", "not slow", "inconclusive"
# Runs of a probe after its first while it rules out neither end (``bisect``).
MORE_ROUNDS = 2
# A probe's false classing stays within ALPHA, as a verdict's false alarm does: each of its
# looks tests at its Bonferroni share.
PROBE_ALPHA = ALPHA / (1 + MORE_ROUNDS)


@dataclass(frozen=True)
class Level:
    """A case's head/base level at one commit against GOOD: its pairs' mean log ratio, that
    mean's standard error and degrees of freedom (the paired t-test's, ``paired.one_sample``)."""

    log: float
    se: float
    df: float

    @property
    def ratio(self) -> float:
        return math.exp(self.log)


def level_of(runs: list[dict[str, Any]]) -> tuple[Level | None, int]:
    """A case's level from its ``ab`` facts of runs at one commit (oldest first), and the pairs
    behind it: in turns every run's pairs (launch medians) pooled; in duet the last run's (window
    log ratios). None with fewer than two pairs or a figure that is not positive."""
    duet = any(ab.get("mode") == "duet" for ab in runs)
    pairs = [p for ab in (runs[-1:] if duet else runs) for p in ab.get("pairs") or []]
    try:
        logs = [float(p["window_log_ratio"]) if duet else math.log(p["head"] / p["base"])
                for p in pairs]
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None, len(pairs)
    if len(logs) < 2 or not all(math.isfinite(v) for v in logs):
        return None, len(logs)
    test, _ = paired.one_sample(logs, halves=duet)
    return Level(test.diff, test.se, test.df), len(logs)


@dataclass(frozen=True)
class Judgement:
    """One case of a probe against both ends."""

    side: str  # SLOW, NOT_SLOW or INCONCLUSIVE (neither end ruled out)
    p_good: float  # one-sided p of "as fast as GOOD" (small: GOOD's 1 is ruled out)
    p_slow: float  # one-sided p of "as slow as the slow end" (small: the slow end ruled out)
    good_odds: float  # how likely the good end is rather than the slow (equal odds before)
    nearer: str  # the end nearer on a log scale: NOT_SLOW or SLOW
    between: bool = False  # both ruled out: a partial slowdown, classed with the nearer end

    def text(self, slow: Level) -> str:
        good = f"GOOD's 1.000 (p={self.p_good:.2g})"
        end = f"the slow end {slow.ratio:.3f} (p={self.p_slow:.2g})"
        if self.between:
            return (f"rules out both {good} and {end}: between them (a partial slowdown), "
                    f"nearer the {'slow' if self.nearer == SLOW else 'good'} end: {self.side}")
        if self.side == NOT_SLOW:
            return f"rules out {end}, not {good}: {self.side}"
        if self.side == SLOW:
            return f"rules out {good}, not {end}: {self.side}"
        return (f"rules out neither {good} nor {end}: {self.good_odds:.0%} likely at the "
                "good end")


def judge(probe: Level, slow: Level, alpha: float = PROBE_ALPHA) -> Judgement:
    """``probe`` against GOOD's level (1, exact: the A/B run is against GOOD) and the slow
    end's (``slow``, measured at BAD, so with its own error: Welch's test of the difference).
    An end is ruled out where its one-sided p is below ``alpha``."""
    from scipy.special import stdtr  # Student's t CDF (scipy.stats costs 0.5 s more to import)

    gap = probe.log - slow.log
    se = max(probe.se, 1e-12)  # (pairs that agree exactly have no spread)
    gap_se = max(math.hypot(probe.se, slow.se), 1e-12)
    welch = gap_se ** 4 / (se ** 4 / probe.df + slow.se ** 4 / slow.df)
    p_good = float(stdtr(probe.df, probe.log / se))  # small: slower than GOOD
    p_slow = float(stdtr(welch, -gap / gap_se))  # small: faster than the slow end
    nearer = NOT_SLOW if abs(probe.log) <= abs(gap) else SLOW
    # Each end's likelihood of the probe's mean, with its error
    at_slow_over_good = (_log_density(gap / gap_se, welch) - math.log(gap_se)
                         - _log_density(probe.log / se, probe.df) + math.log(se))
    good_odds = 1 / (1 + math.exp(min(700.0, at_slow_over_good)))
    good_out, slow_out = p_good < alpha, p_slow < alpha
    if good_out and slow_out:
        return Judgement(nearer, p_good, p_slow, good_odds, nearer, between=True)
    side = SLOW if good_out else NOT_SLOW if slow_out else INCONCLUSIVE
    return Judgement(side, p_good, p_slow, good_odds, nearer)


def _log_density(t: float, df: float) -> float:
    """Student's t log density (in logs: far from both ends, both densities underflow)."""
    return (math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - math.log(df * math.pi) / 2
            - (df + 1) / 2 * math.log1p(t * t / df))


