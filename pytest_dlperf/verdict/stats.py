"""The regression verdict: a case's launches against its baseline's, for one metric.

Evidence has two levels. A **launch** is one start of the case's processes (a fresh process
group, a fresh warm-up) that times one or more **windows**. Windows of one launch agree closely
(1-2% on this project's CPU machine) while launches minutes apart wander by several percent: a
test that counts windows as independent samples is overconfident by that ratio and cries wolf
across runs. So the unit of evidence is the launch: each launch is summarized by the median of
its windows, and the verdict is a two-sample t-test on the logarithms of the launch medians
(relative changes; the between-launch spread is pooled over both sides).

A **regression** needs both practical and statistical significance: the median of the launch
medians (DLPerf's figure) worse than the baseline's by more than the tolerance, *and* a
one-sided p below ``alpha`` for a drop at all. A median beyond the tolerance without that
evidence is **inconclusive**: the caller adds launches and asks again (``alpha`` is split over
the looks, ``look_alpha``). An **improvement** is the mirror image; an unproven gain is a pass.
With one launch on each side the between-launch spread is unknown: nothing can be proven, so a
median beyond the tolerance is inconclusive and more launches settle it. Throughput is
higher-is-better; memory and step time are lower-is-better (``higher_is_better=False``).

The verdict depends only on the multisets of figures (launch order and window order within a
launch do not matter). scipy is imported on first use: importing the plugin stays cheap.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..core.protocol import median, median_of_launches

PASS = "pass"
REGRESSION = "regression"
IMPROVEMENT = "improvement"
INCONCLUSIVE = "inconclusive"
NO_BASELINE = "no-baseline"

ALPHA = 0.01  # one-sided false-alarm budget of a whole verdict (split over its looks)
# A change beyond this factor is not drift (the largest seen between runs of an unchanged case
# on this project's VMs: 1.39x slower); ``levels`` judges it on the launches alone.
DOUBT_FACTOR = 2.0
# The farthest a ratio's interval reaches, in logs (``TTest.ratio_interval``).
LOG_END = 700.0
# The most runs of an unchanged case are taken to drift apart where nothing measured it (a
# baseline of one run, no other baseline of the machine with two, no history): ``levels`` fails
# a drop the launches prove beyond it. The largest drift seen between runs of an unchanged case
# on this project's VMs was 1.39x slower, so it never reaches 1.5x, which leaves the drops
# unchanged nights never make (the nightlies: 1.77x and 1.89x) 18-26% for the launches
# to prove it by.
DRIFT_BOUND = 1.5
# Where a drift between runs was measured (the baseline's runs, the machine's, the history's), the
# bound is this many standard deviations of the difference it gives between this run and the
# baseline's mean, where that is wider than DRIFT_BOUND: a runner that drifts more than the VMs
# here is judged by its own drift (one-sided, ~0.1% of unchanged runs past it, were it normal).
DRIFT_Z = 3.0

Launches = Sequence[Sequence[float]]  # one list of window figures per launch


@dataclass(frozen=True)
class Verdict:
    outcome: str
    measured: float  # median of the launch medians
    baseline: float | None = None  # median of the baseline's launch medians
    tolerance: float | None = None
    higher_is_better: bool = True
    alpha: float = ALPHA  # this look's one-sided significance level
    p_worse: float | None = None  # t-test on log launch medians, one-sided: measured is worse
    p_better: float | None = None
    ratio_ci: tuple[float, float] | None = None  # CI of the ratio of geometric mean launch medians
    # (what the t-test is about; the tolerance gate uses the medians)
    samples: int = 0  # windows measured
    baseline_samples: int = 0
    launches: int = 0
    baseline_launches: int = 0
    spread: float | None = None  # standard deviation of log medians (~ CV) between launches,
    # or between runs where ``level`` is "runs"
    level: str = "launches"  # what the test compared: "launches", "runs", "machine", "history"
    # or "one-run" (``levels``)
    baseline_runs: int = 0  # the runs the baseline's launches came from (0: not asked)
    resolvable: bool = True  # more launches of this run can settle an inconclusive verdict
    beyond_doubt: bool = False  # a change no drift between runs explains (``levels``)
    drift: str | None = None  # the pooled drift the verdict used (level "machine", "history")
    # The most runs are taken to drift apart (a factor, ``levels``), asked of a drop beyond the
    # tolerance that the level's own test left unproven: where it came from ("default":
    # DRIFT_BOUND; "drift": DRIFT_Z standard deviations of the drift the level used), the
    # one-sided p that the drop is within it, and whether the launches proved it beyond.
    bound: float | None = None
    bound_from: str | None = None
    bound_p: float | None = None
    beyond_bound: bool = False

    @property
    def threshold(self) -> float | None:
        """The worst median that can still pass."""
        if self.baseline is None or self.tolerance is None:
            return None
        sign = -1 if self.higher_is_better else 1
        return self.baseline * (1 + sign * self.tolerance)

    @property
    def delta(self) -> float | None:
        """Relative change against the baseline (+0.03 is 3% higher)."""
        if self.baseline is None:
            return None
        return self.measured / self.baseline - 1

    @property
    def spread_known(self) -> bool:
        return self.spread is not None

    @property
    def settled(self) -> bool:
        """Whether more launches are needless: a proven change, or a pass whose interval
        lies within the tolerance on the worse side (not from a one-run baseline: its interval
        is the launches', and how runs differ is unknown)."""
        if self.outcome in (REGRESSION, IMPROVEMENT):
            return True
        if (self.outcome != PASS or self.ratio_ci is None or self.tolerance is None
                or self.level == "one-run"):
            return False
        lo, hi = self.ratio_ci
        return lo >= 1 - self.tolerance if self.higher_is_better else hi <= 1 + self.tolerance

    @property
    def detectable(self) -> float | None:
        """The smallest relative change this comparison could prove at its ``alpha`` (half the
        width of its interval): changes smaller than this cannot be told from the
        between-launch noise with these many launches."""
        if self.ratio_ci is None:
            return None
        lo, hi = self.ratio_ci
        return float(math.sqrt(hi / lo) - 1)

    @property
    def evidence(self) -> str:
        """The statistics behind the outcome, for messages."""
        if self.baseline is None:
            return ""
        counts = (f"{self.launches} vs {self.baseline_launches} launch"
                  f"{'es' if self.baseline_launches != 1 else ''} ({self.samples} vs "
                  f"{self.baseline_samples} windows)")
        if self.level == "one-run" and self.beyond_bound:
            interval = ""
            if self.ratio_ci is not None:
                lo, hi = self.ratio_ci
                interval = f", {1 - 2 * self.alpha:.1%} CI of the ratio [{lo:.3f}, {hi:.3f}]"
            return (f"{counts}; the baseline was recorded by one run, so the spread between "
                    f"runs is unknown, but the drop is {self.bound_text}{interval}")
        if self.level == "one-run":
            return (f"{counts}; the baseline was recorded by one run, so the spread between "
                    "runs is unknown and a difference this size may be the machine's drift "
                    "between sessions (more launches of this run cannot tell"
                    + (f", unless they prove the drop {self.bound_text}" if self.bound else "")
                    + "): add later runs to the baseline with --dlperf-update-baselines=add, or "
                    "judge head against base in one run with --dlperf-ab")
        if self.spread is None:
            return (f"{counts}; the between-run spread is unknown with one launch on each "
                    "side: record the baseline with --dlperf-launches 2 or more (or add runs "
                    "to it with --dlperf-update-baselines=add)")
        p = self.p_better if self.outcome == IMPROVEMENT else self.p_worse
        if self.level in ("machine", "history"):
            level = (f"{self.drift}; the baseline's {self.baseline_runs} run"
                     f"{'s' if self.baseline_runs != 1 else ''}")
        elif self.level == "runs":
            level = (f"between-run spread {self.spread:.1%} over the baseline's "
                     f"{self.baseline_runs} runs")
        else:
            level = f"between-launch spread {self.spread:.1%}"
        parts = [counts, level, f"t-test p={p:.3g}"]
        if self.ratio_ci is not None:
            lo, hi = self.ratio_ci
            parts.append(f"{1 - 2 * self.alpha:.1%} CI of the ratio [{lo:.3f}, {hi:.3f}]")
        text = ", ".join(parts)
        if self.beyond_doubt:
            text += (f"; beyond a factor of {DOUBT_FACTOR:g}, more than runs drift: judged on "
                     "the launches")
        elif self.beyond_bound:
            text += f"; the drop is {self.bound_text}"
        elif self.bound is not None and self.bound_p is not None:
            text += f"; not proven {self.bound_text} (t-test p={self.bound_p:.3g})"
        return text

    @property
    def bound_text(self) -> str:
        """The drift bound a drop was judged against, for messages: "beyond the default bound
        of 1.5x: more than this machine is expected to drift between runs (the launches prove
        it: t-test p=...)"; "" where none was asked."""
        if self.bound is None:
            return ""
        which = (f"the default bound of {self.bound:.3g}x" if self.bound_from == "default"
                 else f"a bound of {self.bound:.3g}x ({DRIFT_Z:g} standard deviations of the "
                      "drift between runs it was judged by)")
        if self.beyond_bound:
            p = "" if self.bound_p is None else f": t-test p={self.bound_p:.3g}"
            return (f"beyond {which}: more than this machine is expected to drift between runs "
                    f"(the launches prove it{p})")
        return f"beyond {which}, more than this machine is expected to drift between runs"

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data.update(threshold=self.threshold, delta=self.delta, confidence=1 - 2 * self.alpha,
                    ratio_ci=list(self.ratio_ci) if self.ratio_ci else None,
                    detectable=self.detectable)
        return data


def _check(launches: Launches, what: str) -> list[list[float]]:
    checked = []
    for launch in launches:
        values = sorted(float(v) for v in launch)
        if not values or not all(v > 0 and math.isfinite(v) for v in values):
            raise ValueError(f"{what} must be non-empty lists of positive numbers (one per "
                             f"launch), got {list(launches)!r}")
        checked.append(values)
    if not checked:
        raise ValueError(f"{what} must hold at least one launch, got {list(launches)!r}")
    return checked


def launch_medians(launches: Launches) -> list[float]:
    """Each launch's median window figure."""
    return [median(list(launch)) for launch in launches]


def look_alpha(looks: int) -> float:
    """The significance level of each look when a verdict may be taken ``looks`` times (after
    extra launches): Bonferroni, so the whole procedure's false alarms stay within ALPHA."""
    return ALPHA / max(1, looks)


def spent_alpha(look: int, looks: int, planned: int) -> float:
    """The significance level of look ``look`` (1-based: after that many launches) of a
    verdict taken up to ``looks`` times whose run plans ``planned`` launches: half of ALPHA at
    the planned look, where the run's own evidence is complete and the between-run verdict is
    meant to be taken, the other half split over every other look (the early ones catch a drop
    beyond doubt, the extra ones settle a noisy run). A weighted Bonferroni: the levels sum to
    ALPHA, so the whole procedure's false alarms stay within it, and the planned look keeps
    power that an even split over seven looks gave away."""
    looks = max(1, looks)
    if looks == 1:
        return ALPHA
    if not 1 <= planned <= looks:
        return ALPHA / looks
    return ALPHA / 2 if look == planned else ALPHA / 2 / (looks - 1)


def compare(launches: Launches, baseline: Launches | None, tolerance: float, *,
            higher_is_better: bool = True, alpha: float = ALPHA) -> Verdict:
    """Judge ``launches`` (the window figures of each launch of this run) against the
    baseline's launches. ``alpha`` is the one-sided level of the test; the interval is
    two-sided at ``1 - 2 * alpha``, so each of its tails matches it."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    measured = _check(launches, "samples")
    medians = sorted(launch_medians(measured))  # sorted: sums do not depend on launch order
    measured_median = median_of_launches(measured)
    windows = sum(len(launch) for launch in measured)
    if baseline is None:
        return Verdict(NO_BASELINE, measured_median, samples=windows, launches=len(measured))
    base = _check(baseline, "baseline samples")
    base_medians = sorted(launch_medians(base))
    base_median = median_of_launches(base)
    counts: dict[str, Any] = dict(
        samples=windows, baseline_samples=sum(len(launch) for launch in base),
        launches=len(measured), baseline_launches=len(base))
    ratio = measured_median / base_median
    # "good" is the ratio oriented so that > 1 is better, whatever the metric's direction.
    good = ratio if higher_is_better else 1 / ratio
    test = pooled_t_test([math.log(v) for v in medians], [math.log(v) for v in base_medians])
    if test is None:  # one launch a side: nothing can be proven either way
        outcome = INCONCLUSIVE if good < 1 - tolerance else PASS
        return Verdict(outcome, measured_median, base_median, tolerance, higher_is_better, alpha,
                       None, None, None, **counts)
    p_less, p_greater, spread = test.p_less, test.p_greater, test.spread
    lo, hi = test.ratio_interval(alpha)
    p_worse, p_better = (p_less, p_greater) if higher_is_better else (p_greater, p_less)
    outcome = decide_outcome(good, tolerance, p_worse, p_better, alpha)
    return Verdict(outcome, measured_median, base_median, tolerance, higher_is_better, alpha, p_worse,
                   p_better, (lo, hi), spread=spread, **counts)


def decide_outcome(good: float, tolerance: float, p_worse: float, p_better: float,
                   alpha: float) -> str:
    """The four outcomes from the ratio oriented so that > 1 is better (``good``) and the
    one-sided p-values: beyond the tolerance and significant is a regression (improvement);
    worse beyond it without that evidence, inconclusive; else a pass. The baseline verdict and
    the A/B verdict (``paired``) both ask it."""
    if good < 1 - tolerance:
        return REGRESSION if p_worse < alpha else INCONCLUSIVE
    if good > 1 + tolerance and p_better < alpha:
        return IMPROVEMENT
    return PASS


@dataclass(frozen=True)
class TTest:
    """Student's two-sample t-test with pooled variance: mean(a) - mean(b), its standard error,
    the degrees of freedom and the pooled standard deviation. The one t-test of the package:
    the verdict (logs of launch medians) and the change points (runs either side of a split)
    both ask it."""

    diff: float
    se: float
    df: int
    spread: float

    @property
    def p_less(self) -> float:
        """One-sided p that mean(a) is less than mean(b)."""
        if self.se == 0:  # no spread at all: the difference is exact
            return 0.0 if self.diff < 0 else (0.5 if self.diff == 0 else 1.0)
        from scipy.stats import t as student

        return float(student.cdf(self.diff / self.se, self.df))

    @property
    def p_greater(self) -> float:
        """One-sided p that mean(a) is greater than mean(b)."""
        if self.se == 0:
            return 0.0 if self.diff > 0 else (0.5 if self.diff == 0 else 1.0)
        from scipy.stats import t as student

        return float(student.sf(self.diff / self.se, self.df))

    @property
    def p_two_sided(self) -> float:
        """Two-sided p that the means are equal."""
        if self.se == 0:
            return 0.0 if self.diff != 0 else 1.0
        from scipy.stats import t as student

        return float(2 * student.sf(abs(self.diff / self.se), self.df))

    def interval(self, alpha: float) -> tuple[float, float]:
        """The ``1 - 2 alpha`` interval of the difference."""
        if self.se == 0:
            return self.diff, self.diff
        from scipy.stats import t as student

        half = float(student.ppf(1 - alpha, self.df)) * self.se
        return self.diff - half, self.diff + half

    def ratio_interval(self, alpha: float) -> tuple[float, float]:
        """``interval`` of a difference of logs, as a ratio. An end past e^±700 (one degree of
        freedom at a small share of ALPHA and launches 20x apart reach it; exp overflows at 709)
        is held there: an interval that wide says nothing, and stays a number in the results'
        JSON."""
        lo, hi = (max(-LOG_END, min(LOG_END, end)) for end in self.interval(alpha))
        return math.exp(lo), math.exp(hi)


def pooled_t_test(a: Sequence[float], b: Sequence[float]) -> TTest | None:
    """The pooled t-test of ``a`` against ``b``; None when there are no degrees of freedom."""
    n, m = len(a), len(b)
    df = n + m - 2
    if n < 1 or m < 1 or df < 1:
        return None
    mean_a, mean_b = math.fsum(a) / n, math.fsum(b) / m
    ss = math.fsum((v - mean_a) ** 2 for v in a) + math.fsum((v - mean_b) ** 2 for v in b)
    spread = math.sqrt(ss / df)
    return TTest(mean_a - mean_b, spread * math.sqrt(1 / n + 1 / m), df, spread)


def within_launch_cv(launches: Launches) -> float | None:
    """How far windows lie from their own launch's mean, pooled over the launches, over the
    mean of all windows: the noise a launch measures with, apart from the drift between
    launches (which the verdict models, ``levels``). None where no launch timed two windows."""
    ss = math.fsum((v - statistics.fmean(launch)) ** 2 for launch in launches for v in launch)
    df = sum(len(launch) - 1 for launch in launches)
    if df < 1:
        return None
    return math.sqrt(ss / df) / statistics.fmean([v for launch in launches for v in launch])


def within_launch_df(launches: Launches) -> int:
    """The degrees of freedom ``within_launch_cv`` is estimated from: windows less launches."""
    return sum(len(launch) - 1 for launch in launches)


def coefficient_of_variation(samples: Sequence[float]) -> float:
    """Sample standard deviation over mean (0 for a single sample): how noisy the repeats were."""
    if len(samples) < 2:
        return 0.0
    return statistics.stdev(samples) / statistics.mean(samples)
