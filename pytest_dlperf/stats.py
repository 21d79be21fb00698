"""The regression verdict: a case's repeat samples against its baseline's, for one metric.

A **regression** needs both a median worse than the baseline's by more than the tolerance *and*
evidence that the difference is real: a one-sided Mann-Whitney U test (p < ``alpha``) or a
bootstrap confidence interval of the median ratio lying wholly beyond the tolerance (the interval
is what still works when one side has a single sample, e.g. a migrated scalar). When a verdict
may be looked at again after extra repeats, ``alpha`` is split over the looks (``look_alpha``). A median beyond
the tolerance without that evidence is **inconclusive**: the caller adds repeats and asks again.
An **improvement** is the mirror image; an unproven gain is a pass. Throughput is higher-is-better;
memory and step time are lower-is-better (``higher_is_better=False``).

The verdict depends only on the multisets of samples (both sides are sorted before resampling and
the bootstrap seed is fixed), so it is reproducible and invariant to sample order. scipy is
imported on first use: importing the plugin stays cheap.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Sequence

PASS = "pass"
REGRESSION = "regression"
IMPROVEMENT = "improvement"
INCONCLUSIVE = "inconclusive"
NO_BASELINE = "no-baseline"

ALPHA = 0.01  # one-sided false-alarm budget of a whole verdict (split over its looks)
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20_200_601  # fixed: the same samples always give the same verdict


@dataclass(frozen=True)
class Verdict:
    outcome: str
    measured: float  # median of the samples
    baseline: float | None = None  # median of the baseline's samples
    tolerance: float | None = None
    higher_is_better: bool = True
    alpha: float = ALPHA  # this look's one-sided significance level
    p_worse: float | None = None  # Mann-Whitney U, one-sided: the measured side is worse
    p_better: float | None = None
    ratio_ci: tuple[float, float] | None = None  # bootstrap CI of measured/baseline medians
    samples: int = 0
    baseline_samples: int = 0

    @property
    def threshold(self) -> float | None:
        """The worst median that can still pass."""
        if self.baseline is None or self.tolerance is None:
            return None
        sign = -1 if self.higher_is_better else 1
        return self.baseline * (1 + sign * self.tolerance)

    @property
    def delta(self) -> float | None:
        """Relative change of the median against the baseline's (+0.03 is 3% higher)."""
        if self.baseline is None:
            return None
        return self.measured / self.baseline - 1

    @property
    def evidence(self) -> str:
        """The statistics behind the outcome, for messages."""
        if self.baseline is None:
            return ""
        parts = [f"{self.samples} vs {self.baseline_samples} repeats"]
        if self.p_worse is not None:
            p = self.p_worse if self.outcome != IMPROVEMENT else self.p_better
            parts.append(f"Mann-Whitney p={p:.3g}")
        if self.ratio_ci is not None:
            lo, hi = self.ratio_ci
            parts.append(f"{1 - 2 * self.alpha:.1%} CI of the median ratio [{lo:.3f}, {hi:.3f}]")
        return ", ".join(parts)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data.update(threshold=self.threshold, delta=self.delta, confidence=1 - 2 * self.alpha,
                    ratio_ci=list(self.ratio_ci) if self.ratio_ci else None)
        return data


def _check(samples: Sequence[float], what: str) -> list[float]:
    values = sorted(float(v) for v in samples)
    if not values or not all(v > 0 for v in values):
        raise ValueError(f"{what} must be a non-empty list of positive numbers, got {samples!r}")
    return values


def look_alpha(looks: int) -> float:
    """The significance level of each look when a verdict may be taken ``looks`` times (after
    extra repeats): Bonferroni, so the whole procedure's false alarms stay within ALPHA."""
    return ALPHA / max(1, looks)


def compare(samples: Sequence[float], baseline: Sequence[float] | None, tolerance: float, *,
            higher_is_better: bool = True, alpha: float = ALPHA) -> Verdict:
    """Judge ``samples`` (one figure per repeat) against the baseline's repeat samples.
    ``alpha`` is the one-sided level of the rank test; the bootstrap interval is two-sided at
    ``1 - 2 * alpha``, so each of its tails matches it."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    measured = _check(samples, "samples")
    median = float(statistics.median(measured))
    if baseline is None:
        return Verdict(NO_BASELINE, median, samples=len(measured))
    base = _check(baseline, "baseline samples")
    base_median = float(statistics.median(base))
    p_worse, p_better = _rank_test(measured, base, higher_is_better)
    interval = _ratio_interval(measured, base, 1 - 2 * alpha)
    lo, hi = interval if interval is not None else (0.0, float("inf"))
    # "good" is the ratio oriented so that > 1 is better, whatever the metric's direction.
    ratio = median / base_median
    good, good_lo, good_hi = ((ratio, lo, hi) if higher_is_better else (1 / ratio, 1 / hi, 1 / lo))
    if good < 1 - tolerance:
        proven = p_worse < alpha or good_hi < 1 - tolerance
        outcome = REGRESSION if proven else INCONCLUSIVE
    elif good > 1 + tolerance and (p_better < alpha or good_lo > 1 + tolerance):
        outcome = IMPROVEMENT
    else:
        outcome = PASS
    return Verdict(outcome, median, base_median, tolerance, higher_is_better, alpha, p_worse,
                   p_better, interval, len(measured), len(base))


def _rank_test(measured: list[float], base: list[float], higher_is_better: bool) -> tuple[float, float]:
    """One-sided Mann-Whitney U p-values that the measured side is worse / better."""
    from scipy.stats import mannwhitneyu

    worse = "less" if higher_is_better else "greater"
    better = "greater" if higher_is_better else "less"
    return (float(mannwhitneyu(measured, base, alternative=worse).pvalue),
            float(mannwhitneyu(measured, base, alternative=better).pvalue))


def _ratio_interval(measured: list[float], base: list[float],
                    confidence: float) -> tuple[float, float] | None:
    """Percentile bootstrap interval of median(measured) / median(base); None for one sample
    against one sample, which says nothing about noise."""
    import numpy as np
    from scipy.stats import bootstrap

    rng = np.random.default_rng(BOOTSTRAP_SEED)
    options = dict(vectorized=True, confidence_level=confidence, method="percentile",
                   n_resamples=BOOTSTRAP_RESAMPLES, rng=rng)
    if len(measured) == 1 and len(base) == 1:
        return None
    if len(set(measured)) == 1 and len(set(base)) == 1:  # no spread: the interval is a point
        point = measured[0] / base[0]
        return point, point
    if len(base) == 1 or len(measured) == 1:  # a single sample has no spread to resample
        fixed, varying, invert = (base[0], measured, False) if len(base) == 1 else \
            (measured[0], base, True)
        result = bootstrap((np.asarray(varying),), lambda a, axis=-1: np.median(a, axis=axis),
                           **options)
        lo, hi = result.confidence_interval.low / fixed, result.confidence_interval.high / fixed
        return (float(1 / hi), float(1 / lo)) if invert else (float(lo), float(hi))

    def ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.asarray(np.median(a, axis=axis) / np.median(b, axis=axis))

    result = bootstrap((np.asarray(measured), np.asarray(base)), ratio, paired=False,
                       **options)
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def coefficient_of_variation(samples: Sequence[float]) -> float:
    """Sample standard deviation over mean (0 for a single sample): how noisy the repeats were."""
    if len(samples) < 2:
        return 0.0
    return statistics.stdev(samples) / statistics.mean(samples)
