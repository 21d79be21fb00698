"""What a case's figures mean: verdicts, whether to measure more, whether to record, and what to
tell the user. Pure functions of the figures and the policy: no launching, no files, no pytest,
so every branch is tested on numbers alone (tests/test_decide.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .baselines import Baseline
from .report import CaseReport
from .stats import (IMPROVEMENT, INCONCLUSIVE, NO_BASELINE, REGRESSION, Verdict, compare,
                    look_alpha)


@dataclass(frozen=True)
class Policy:
    """The session's rules for one case."""

    tolerance: float
    repeats: int  # windows per launch (the protocol's repeats)
    max_repeats: int  # windows in total before an inconclusive verdict stands
    can_add_repeats: bool = True  # the launcher can run the case again (not external mode)
    update: str | None = None  # --dlperf-update-baselines: None | "all" | "missing"
    strict: bool = False
    unstable_cv: float = 0.10

    @property
    def looks(self) -> int:
        """How many times a verdict may be taken: once, then once per batch of extra repeats
        (each look gets its share of the false-alarm budget)."""
        if not self.can_add_repeats:
            return 1
        extra = max(0, self.max_repeats - self.repeats)
        return 1 + -(-extra // self.repeats)


def efficiencies(samples: Sequence[float], reference: float, devices: int) -> list[float]:
    """Per-window scaling efficiency: each window's samples/s over (1n1d median x devices)."""
    return [rate / (reference * devices) for rate in samples]


def verdicts(samples: Sequence[float], baseline: Baseline | None, reference: float | None,
             devices: int, tolerance: float, policy: Policy) -> tuple[Verdict, Verdict | None]:
    """Throughput, and a multi-device case's scaling efficiency, each sample against the
    baseline's samples."""
    alpha = look_alpha(policy.looks)
    verdict = compare(samples, baseline.throughput.repeats if baseline else None, tolerance,
                      alpha=alpha)
    if reference is None or baseline is None or baseline.efficiency is None:
        return verdict, None
    return verdict, compare(efficiencies(samples, reference, devices),
                            baseline.efficiency.repeats, tolerance, alpha=alpha)


def more_repeats(verdict: Verdict, efficiency: Verdict | None, measured: int,
                 policy: Policy) -> int:
    """How many more windows to measure: a protocol's worth while a figure is inconclusive, up
    to ``max_repeats``; none once either figure is a proven regression (more windows cannot
    undo it), when replacing every baseline, or where the launcher cannot run the case again
    (external mode: every rank would have to agree)."""
    outcomes = (verdict.outcome, efficiency.outcome if efficiency else None)
    if (INCONCLUSIVE not in outcomes or REGRESSION in outcomes or policy.update == "all"
            or not policy.can_add_repeats):
        return 0
    return max(0, min(policy.repeats, policy.max_repeats - measured))


def records(policy: Policy, has_baseline: bool) -> bool:
    """Whether this run writes the case's baseline."""
    return policy.update == "all" or (policy.update == "missing" and not has_baseline)


@dataclass
class Decision:
    """The case's outcome: a failure message (None: it passes) and warnings to attach."""

    failure: str | None = None
    warnings: list[str] = field(default_factory=list)


def decide(report: CaseReport, policy: Policy) -> Decision:
    decision = Decision()
    unstable = unstable_warning(report, policy)
    if unstable:  # recording a noisy baseline deserves the warning most
        decision.warnings.append(unstable)
    if report.baseline_change is not None:
        return decision
    verdict, efficiency = report.verdict, report.efficiency_verdict
    if verdict.outcome == REGRESSION:
        decision.failure = regression_message(report)
        return decision
    if efficiency is not None and efficiency.outcome == REGRESSION:
        decision.failure = (
            f"pytest-dlperf: SCALING REGRESSION in {report.case}: scaling efficiency "
            f"{efficiency.measured:.1%} (speedup {report.speedup:.2f} on "
            f"{report.topology.world_size} devices) is below the threshold "
            f"{efficiency.threshold:.1%} (baseline {efficiency.baseline:.1%} from "
            f"{report.baseline_path}, tolerance {efficiency.tolerance:.1%}; "
            f"{efficiency.evidence})")
        return decision
    for what, v in ((f"{report.workload.unit}/s", verdict), ("scaling efficiency", efficiency)):
        if v is not None and v.outcome == INCONCLUSIVE:
            message = inconclusive_message(report, what, v, policy)
            if policy.strict:
                decision.failure = message + " (failing: --dlperf-strict)"
                return decision
            decision.warnings.append(message)
    if verdict.outcome == NO_BASELINE:
        message = (f"pytest-dlperf: no baseline for {report.case} on this fingerprint "
                   f"(expected {report.baseline_path}); measured {verdict.measured:,.2f} "
                   f"{report.workload.unit}/s; record one with --dlperf-update-baselines")
        if policy.strict:
            decision.failure = message + " (failing: --dlperf-strict)"
        else:
            decision.warnings.append(message)
    elif verdict.outcome == IMPROVEMENT:
        decision.warnings.append(
            f"pytest-dlperf: {report.case} is {verdict.delta:+.1%} faster than its baseline "
            f"({verdict.measured:,.2f} vs {verdict.baseline:,.2f} {report.workload.unit}/s; "
            f"{verdict.evidence}); consider --dlperf-update-baselines")
    return decision


def regression_message(report: CaseReport) -> str:
    v: Verdict = report.verdict
    repeats = ", ".join(f"{x:,.2f}" for x in report.result.samples_per_s)
    return (f"pytest-dlperf: REGRESSION in {report.case}: {report.workload.unit}/s median "
            f"{v.measured:,.2f} is below the threshold {v.threshold:,.2f} (baseline median "
            f"{v.baseline:,.2f} from {report.baseline_path}, tolerance {v.tolerance:.1%}, delta "
            f"{v.delta:+.1%}) and the drop is significant ({v.evidence}); repeats: [{repeats}]")


def inconclusive_message(report: CaseReport, what: str, v: Verdict, policy: Policy) -> str:
    return (f"pytest-dlperf: INCONCLUSIVE {report.case}: {what} median {v.measured:,.4g} is "
            f"{v.delta:+.1%} against the baseline's {v.baseline:,.4g} (beyond the tolerance "
            f"{v.tolerance:.1%}) but the difference is not significant ({v.evidence}) after "
            f"{len(report.result.window_s)} repeats (--dlperf-max-repeats "
            f"{policy.max_repeats}); rerun on a quieter machine, raise --dlperf-max-repeats "
            "or --dlperf-steps")


def unstable_warning(report: CaseReport, policy: Policy) -> str | None:
    if report.cv <= policy.unstable_cv:
        return None
    samples = report.result.samples_per_s
    unit = report.workload.unit
    return (f"pytest-dlperf: {report.case} is unstable: its {len(samples)} repeats vary by "
            f"{report.cv:.1%} (coefficient of variation; --dlperf-unstable-cv "
            f"{policy.unstable_cv:.0%}), from {min(samples):,.2f} to {max(samples):,.2f} "
            f"{unit}/s; its verdict is weaker for it. Quiet the machine (other jobs, CPU "
            "frequency scaling), or lengthen the windows with --dlperf-steps")
