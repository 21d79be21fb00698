"""What a case's figures mean: verdicts, whether to measure more, whether to record, and what to
tell the user. Pure functions of the figures and the policy: no launching, no files, no pytest,
so every branch is tested on numbers alone (tests/test_decide.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .baselines import Baseline
from .protocol import split
from .report import CaseReport
from .stats import (IMPROVEMENT, INCONCLUSIVE, NO_BASELINE, REGRESSION, Verdict, compare,
                    look_alpha)


@dataclass(frozen=True)
class Policy:
    """The session's rules for one case."""

    tolerance: float
    repeats: int  # windows of one run: launches x windows per launch
    max_repeats: int  # windows in total before an inconclusive verdict stands
    can_add_repeats: bool = True  # the launcher can run the case again (not external mode)
    update: str | None = None  # --dlperf-update-baselines: None | "all" | "add" | "missing"
    strict: bool = False
    unstable_cv: float = 0.10
    launches: int = 1  # launches of one run
    keep_launches: int = 20  # the most launches an "add" update keeps

    @property
    def looks(self) -> int:
        """How many times a verdict may be taken: once, then once per run's worth of extra
        launches (each look gets its share of the false-alarm budget)."""
        if not self.can_add_repeats:
            return 1
        extra = max(0, self.max_repeats - self.repeats)
        return 1 + -(-extra // self.repeats)

    @property
    def windows_per_launch(self) -> int:
        return -(-self.repeats // self.launches)


def efficiencies(samples: Sequence[float], reference: float, devices: int) -> list[float]:
    """Per-window scaling efficiency: each window's samples/s over (1n1d median x devices)."""
    return [rate / (reference * devices) for rate in samples]


def verdicts(samples: Sequence[float], launch_windows: Sequence[int], baseline: Baseline | None,
             reference: float | None, devices: int, tolerance: float,
             policy: Policy) -> tuple[Verdict, Verdict | None]:
    """Throughput, and a multi-device case's scaling efficiency: this run's launches (window
    figures ``samples``, ``launch_windows`` of them per launch) against the baseline's."""
    alpha = look_alpha(policy.looks)
    sizes = list(launch_windows)
    verdict = compare(split(list(samples), sizes),
                      baseline.throughput.launches if baseline else None, tolerance, alpha=alpha)
    if reference is None or baseline is None or baseline.efficiency is None:
        return verdict, None
    return verdict, compare(split(efficiencies(samples, reference, devices), sizes),
                            baseline.efficiency.launches, tolerance, alpha=alpha)


def more_launches(verdict: Verdict, efficiency: Verdict | None, measured: int,
                  policy: Policy) -> list[int]:
    """The windows of each further launch to measure: a run's worth of whole launches while a
    figure is inconclusive, up to ``max_repeats`` windows in all; none once either figure is a proven
    regression (more launches cannot undo it), when replacing or adding to every baseline, or
    where the launcher cannot run the case again (external mode: every rank would have to
    agree)."""
    outcomes = (verdict.outcome, efficiency.outcome if efficiency else None)
    if (INCONCLUSIVE not in outcomes or REGRESSION in outcomes
            or policy.update in ("all", "add") or not policy.can_add_repeats):
        return []
    # Whole launches only: a launch of fewer windows would count as much as a full one.
    left = max(0, min(policy.repeats, policy.max_repeats - measured))
    return [policy.windows_per_launch] * (left // policy.windows_per_launch)


def records(policy: Policy, has_baseline: bool) -> bool:
    """Whether this run writes the case's baseline."""
    return policy.update in ("all", "add") or (policy.update == "missing" and not has_baseline)


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
        message = no_baseline_message(report)
        if policy.strict:
            decision.failure = message + " (failing: --dlperf-strict)"
        else:
            decision.warnings.append(message)
    elif verdict.baseline_launches == 1:
        decision.warnings.append(
            f"pytest-dlperf: the baseline of {report.case} ({report.baseline_path}) holds a "
            "single launch, so its between-run spread is unknown and the verdict rests on this "
            f"run's {verdict.launches} launch(es) alone; record it again with --dlperf-launches "
            "2 or more, or add this run's launches to it with --dlperf-update-baselines=add")
    if verdict.outcome == IMPROVEMENT:
        decision.warnings.append(
            f"pytest-dlperf: {report.case} is {verdict.delta:+.1%} faster than its baseline "
            f"({verdict.measured:,.2f} vs {verdict.baseline:,.2f} {report.workload.unit}/s; "
            f"{verdict.evidence}); consider --dlperf-update-baselines")
    return decision


def no_baseline_message(report: CaseReport) -> str:
    message = (f"pytest-dlperf: no baseline for {report.case} on machine {report.machine!r} "
               f"with this fingerprint (expected {report.baseline_path}); measured "
               f"{report.verdict.measured:,.2f} {report.workload.unit}/s; record one with "
               "--dlperf-update-baselines")
    if report.other_machines:
        message += (f". This case has baselines of other machines ({', '.join(report.other_machines)}"
                    "), which do not judge this one (hosts of one model have run 40-70% apart); "
                    "if this host is one of them, pass --dlperf-machine NAME")
    if report.unnamed_baselines:
        message += (f". Baselines recorded before machines were named are in "
                    f"{report.unnamed_baselines}: if they were measured on this host, move them "
                    f"under the store's {report.machine}/ folder to judge against them")
    return message


def regression_message(report: CaseReport) -> str:
    v: Verdict = report.verdict
    repeats = " ".join("[" + ", ".join(f"{x:,.2f}" for x in launch) + "]"
                       for launch in report.result.launches)
    return (f"pytest-dlperf: REGRESSION in {report.case}: {report.workload.unit}/s "
            f"median {v.measured:,.2f} (of {v.launches} launch medians) is below the threshold "
            f"{v.threshold:,.2f} (baseline median {v.baseline:,.2f} from {report.baseline_path}, "
            f"tolerance {v.tolerance:.1%}, delta "
            f"{v.delta:+.1%}) and the drop is significant ({v.evidence}); windows by launch: {repeats}")


def inconclusive_message(report: CaseReport, what: str, v: Verdict, policy: Policy) -> str:
    return (f"pytest-dlperf: INCONCLUSIVE {report.case}: {what} median {v.measured:,.4g} is "
            f"{v.delta:+.1%} against the baseline's {v.baseline:,.4g} (beyond the tolerance "
            f"{v.tolerance:.1%}) but the difference is not significant ({v.evidence}) after "
            f"{len(report.result.window_s)} windows in {v.launches} launch(es) "
            f"(--dlperf-max-repeats {policy.max_repeats}); rerun on a quieter machine, raise "
            "--dlperf-max-repeats or --dlperf-launches, or give the baseline more launches "
            "(--dlperf-update-baselines=add)")


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
