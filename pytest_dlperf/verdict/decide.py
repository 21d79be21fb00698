"""What a case's figures mean: verdicts, whether to measure more, whether to record, and what to
tell the user. Pure functions of the figures and the policy: no launching, no files, no pytest,
so every branch is tested on numbers alone (tests/test_decide.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..core.protocol import RankFigures, split
from ..core.units import format_bytes, format_flops
from ..store.baselines import EFFICIENCY, THROUGHPUT, Baseline
from . import phases, position, superlinear, unstable
from .changepoints import Step
from .drift import Drift
from .levels import compare_runs
from .mfu import MEASURED
from .record import CaseReport, efficiencies
from .stats import (
    IMPROVEMENT,
    INCONCLUSIVE,
    NO_BASELINE,
    REGRESSION,
    Verdict,
    compare,
    look_alpha,
    spent_alpha,
)
from .unstable import unrecorded_message, unstable_warning


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
    memory_tolerance: float = 0.10
    min_mfu: float | None = None  # @pytest.mark.dlperf(min_mfu=...)
    straggler_threshold: float = 0.10

    @property
    def windows_per_launch(self) -> int:
        return -(-self.repeats // self.launches)

    @property
    def max_launches(self) -> int:
        """The most launches a case may take: the run's, then more while a verdict is
        inconclusive, up to ``max_repeats`` windows in whole launches (a launch of fewer
        windows would count as much as a full one)."""
        if not self.can_add_repeats:
            return self.launches
        return max(self.launches, self.max_repeats // self.windows_per_launch)

    @property
    def looks(self) -> int:
        """How many times a verdict may be taken: after every launch (a group-sequential
        design: a drop beyond doubt fails after the first launch or two, a clear pass stops
        early too), each look with its share of the false-alarm budget."""
        return self.max_launches


def verdicts(samples: Sequence[float], launch_windows: Sequence[int], baseline: Baseline | None,
             reference: float | None, devices: int, tolerance: float,
             policy: Policy, drifts: Mapping[str, Drift] | None = None
             ) -> tuple[Verdict, Verdict | None]:
    """Throughput, and a multi-device case's scaling efficiency: this run's launches (window
    figures ``samples``, ``launch_windows`` of them per launch) against the baseline's, by the
    runs that recorded them and the machine's drift between runs (``drifts``, by metric name,
    pooled over its baselines: ``levels``, ``drift``), at this look's share of the false-alarm
    budget (``spent_alpha``)."""
    sizes = list(launch_windows)
    alpha = spent_alpha(len(sizes), policy.looks, policy.launches)
    drifts = drifts or {}
    runs = [run.launches for run in baseline.runs] if baseline else None
    early = len(sizes) < policy.launches
    verdict = _early(compare_runs(split(list(samples), sizes),
                                  baseline.throughput.launches if baseline else None, runs,
                                  tolerance, alpha=alpha, drift=drifts.get(THROUGHPUT)), early)
    if reference is None or baseline is None or baseline.efficiency is None:
        return verdict, None
    return verdict, _early(compare_runs(split(efficiencies(samples, reference, devices), sizes),
                                        baseline.efficiency.launches, runs, tolerance,
                                        alpha=alpha, drift=drifts.get(EFFICIENCY)), early)


def _early(verdict: Verdict, early: bool) -> Verdict:
    """Before the run's planned launches are in, only a change beyond doubt is proven: the run's
    mean of one or two launches is what one odd launch moves most (a first launch 16% low of an
    unchanged case was a false regression after one launch, 0.9% of trials against 3-run
    baselines on this VM, before this rule), and its verdict waits for the rest."""
    if early and verdict.outcome == REGRESSION and not verdict.beyond_doubt:
        return replace(verdict, outcome=INCONCLUSIVE, resolvable=True)
    return verdict


def memory_verdict(memory_launches: Sequence[Sequence[float]], baseline: Baseline | None,
                   tolerance: float, policy: Policy) -> Verdict | None:
    """Peak memory, lower is better: this run's launches (each window's peak over the ranks)
    against the baseline's, launch by launch (memory does not drift between runs as time
    does). None where memory was not measured; no-baseline where the baseline has no memory
    figure (recorded before it was measured)."""
    if not memory_launches:
        return None
    base = baseline.memory if baseline is not None else None
    return compare(memory_launches, base.launches if base is not None else None, tolerance,
                   higher_is_better=False, alpha=look_alpha(policy.looks))


def next_launches(judged: Sequence[Verdict | None], launched: int, policy: Policy) -> list[int]:
    """The windows of the next launch, if any, after ``launched`` launches judged as
    ``judged`` (throughput, efficiency, memory): none once a figure is a proven regression
    (more launches cannot undo it) or every figure is settled (a proven change, or a pass whose
    interval is within the tolerance); else the run's planned launches, then more while a
    figure is inconclusive and more launches can settle it, up to ``policy.max_launches``.
    Recording runs (every baseline replaced or added to) take their planned launches, no more;
    external mode takes the one it was given."""
    verdicts = [v for v in judged if v is not None]
    if not policy.can_add_repeats or launched >= policy.max_launches:
        return []
    one = [policy.windows_per_launch]
    if policy.update in ("all", "add"):
        return one if launched < policy.launches else []
    if any(v.outcome == REGRESSION for v in verdicts):
        return []
    if verdicts and all(v.settled for v in verdicts):
        return []
    if launched < policy.launches:
        return one
    return one if any(v.outcome == INCONCLUSIVE and v.resolvable for v in verdicts) else []


def records(policy: Policy, has_baseline: bool) -> bool:
    """Whether this run asks to write the case's baseline (``too_unstable_to_record`` may
    still refuse it)."""
    return policy.update in ("all", "add") or (policy.update == "missing" and not has_baseline)


@dataclass
class Decision:
    """The case's outcome: a failure message (None: it passes) and warnings to attach."""

    failure: str | None = None
    warnings: list[str] = field(default_factory=list)


def decide(report: CaseReport, policy: Policy) -> Decision:
    decision = without_baseline(report, policy)
    if decision.failure is not None or report.baseline_change is not None:
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
            f"{efficiency.evidence})" + phases.suffix(report.baseline_phases, report.phases))
        return decision
    memory = report.memory_verdict
    if memory is not None and memory.outcome == REGRESSION:
        decision.failure = memory_regression_message(report, memory)
        return decision
    step = report.history_blocking
    if step is not None:
        decision.failure = change_point_message(report, step)
        return decision
    for what, v in ((f"{report.workload.unit}/s", verdict), ("scaling efficiency", efficiency),
                    ("peak memory", memory)):
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
    if (memory is not None and memory.outcome == NO_BASELINE
            and verdict.outcome != NO_BASELINE):
        decision.warnings.append(
            f"pytest-dlperf: the baseline of {report.case} ({report.baseline_path}) has no peak "
            "memory (recorded before pytest-dlperf measured it), so memory is not judged; "
            f"measured {format_bytes(memory.measured)}; record it again with "
            "--dlperf-update-baselines")
    if verdict.outcome == IMPROVEMENT:
        decision.warnings.append(
            f"pytest-dlperf: {report.case} is {verdict.delta:+.1%} faster than its baseline "
            f"({verdict.measured:,.2f} vs {verdict.baseline:,.2f} {report.workload.unit}/s; "
            f"{verdict.evidence}); consider --dlperf-update-baselines")
    return decision


def without_baseline(report: CaseReport, policy: Policy) -> Decision:
    """What holds whatever the baseline, on recording runs too: stragglers, a scaling
    efficiency above linear, a noisy case (failing where it was to be recorded), min_mfu."""
    decision = Decision()
    unstable = unstable_warning(report, policy.unstable_cv)
    refused = report.record_refused
    if unstable and refused != "unstable":  # that refusal says the same, and fails
        decision.warnings.append(unstable)
    decision.warnings.extend(stragglers(report.case, report.result.ranks,
                                        policy.straggler_threshold))
    beyond = superlinear.warning(report)
    if beyond and refused != "efficiency":
        decision.warnings.append(beyond)
    if report.scaling_warning:
        decision.warnings.append(f"pytest-dlperf: {report.case}: {report.scaling_warning}")
    if report.launch_position is not None:
        decision.warnings.append(position.warning(report.case, report.launch_position,
                                                  report.workload.unit))
    if refused == "efficiency":
        decision.failure = superlinear.refused_message(report)
    elif refused:
        decision.failure = unrecorded_message(report, policy.unstable_cv)
    elif policy.min_mfu is not None:
        # a measured GEMM rate is no hardware peak: a floor is held against a stated one only
        if report.mfu is None or (report.peak is not None and report.peak.device == MEASURED):
            decision.warnings.append(min_mfu_unknown(report, policy.min_mfu))
        elif report.mfu < policy.min_mfu:
            decision.failure = min_mfu_message(report, policy.min_mfu)
    return decision


def change_point_message(report: CaseReport, step: Step) -> str:
    """A step for the worse in the case's history that this run sits after, unaccepted."""
    return (f"pytest-dlperf: CHANGE POINT in {report.case}: {step.describe()}. The history has "
            f"{report.history_runs} runs of this case and fingerprint, the last "
            f"{step.runs_since} (this one included) after the step, and none of them recorded "
            f"the baseline (this run's own verdict: "
            f"{report.verdict.outcome}). Find the commit that caused it, or accept the new "
            "level by recording the baseline once (--dlperf-update-baselines)")


def no_baseline_message(report: CaseReport) -> str:
    message = (f"pytest-dlperf: no baseline for {report.case} on machine {report.machine!r} "
               f"with this fingerprint (expected {report.baseline_path}); measured "
               f"{report.verdict.measured:,.2f} {report.workload.unit}/s; record one with "
               "--dlperf-update-baselines")
    if report.other_machines:
        message += (f". This case has baselines of other machines ({', '.join(report.other_machines)}"
                    "), which do not judge this one (hosts of one model have run 40-70% apart); "
                    "if this host is one of them, pass --dlperf-machine NAME")
    if report.other_fingerprint:
        message += (". A baseline judges runs of its own fingerprint only, and this "
                    "machine's nearest baseline of this case differs in "
                    f"{report.other_fingerprint}")
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
            f"{v.delta:+.1%}) and the drop is significant ({v.evidence}); windows by launch: "
            f"{repeats}" + phases.suffix(report.baseline_phases, report.phases))


def inconclusive_message(report: CaseReport, what: str, v: Verdict, policy: Policy) -> str:
    start = (f"pytest-dlperf: INCONCLUSIVE {report.case}: {what} median {v.measured:,.4g} is "
             f"{v.delta:+.1%} against the baseline's {v.baseline:,.4g} (beyond the tolerance "
             f"{v.tolerance:.1%}) but the difference is not significant ({v.evidence}) after "
             f"{len(report.result.window_s)} windows in {v.launches} launch(es)")
    if not v.resolvable:  # the evidence says why more launches would not help, and what would
        return start
    return (f"{start} (--dlperf-max-repeats {policy.max_repeats}); rerun on a quieter machine, "
            "raise --dlperf-max-repeats or --dlperf-launches, or give the baseline more runs "
            "(--dlperf-update-baselines=add)")


def _where(rank: RankFigures) -> str:
    return (f"rank {rank.rank} (node {rank.node_rank}, local rank {rank.local_rank}"
            f"{', host ' + rank.host if rank.host else ''})")


def memory_regression_message(report: CaseReport, v: Verdict) -> str:
    ranks = [r for r in report.result.ranks if r.peak is not None]
    worst = max(ranks, key=lambda r: r.peak or 0.0, default=None)
    per_rank = ", ".join(f"rank {r.rank} {format_bytes(r.peak)}" for r in ranks)
    source = worst.memory_source if worst is not None else ""
    at = f"; the largest on {_where(worst)}" if worst is not None else ""
    return (f"pytest-dlperf: MEMORY REGRESSION in {report.case}: peak memory "
            f"{format_bytes(v.measured)} (median of the launches' peaks{at}) is above the "
            f"threshold {format_bytes(v.threshold)} (baseline {format_bytes(v.baseline)} from "
            f"{report.baseline_path}, memory tolerance {v.tolerance:.1%}, delta "
            f"{v.delta:+.1%}) and the growth is significant ({v.evidence}); per rank: "
            f"{per_rank} ({source})")


def stragglers(case: str, ranks: Sequence[RankFigures], threshold: float) -> list[str]:
    """A warning for each rank slower than the median rank by more than ``threshold``. The
    figure compared is each rank's own step time (forward and backward without the
    all-reduce), where every rank has one: under data parallelism the windows of all ranks last
    as long as the slowest rank's, so they cannot name it. The median rank is a real rank (the
    lower median: the faster of two)."""
    if len(ranks) < 2:
        return []
    own = [r.own_step_s for r in ranks]
    if all(v is not None for v in own):
        figures = [float(v) for v in own if v is not None]
        what = "of its own (forward and backward without the all-reduce)"
    else:
        figures = [r.median_step_s for r in ranks]
        what = ("in the timed windows (this adapter has no local_step, and every rank waits "
                "for the slowest at each all-reduce, so this is a weak signal)")
    middle = statistics.median_low(figures)
    warnings = []
    for rank, value in zip(ranks, figures):
        if middle > 0 and value > middle * (1 + threshold):
            warnings.append(
                f"pytest-dlperf: straggler in {case}: {_where(rank)} takes "
                f"{value * 1000:,.1f} ms a step {what}, {value / middle - 1:+.0%} against the "
                f"median rank's {middle * 1000:,.1f} ms (--dlperf-straggler-threshold "
                f"{threshold:.0%}); every rank waits for it at each all-reduce: look at that "
                "device and host (other jobs, clocks and throttling, its NIC)")
    return warnings


def min_mfu_message(report: CaseReport, minimum: float) -> str:
    peak, flops = report.peak, report.flops
    assert peak is not None and report.mfu is not None and flops and flops.per_unit
    per_device = report.result.median / report.topology.world_size
    one = "sample" if report.workload.units_per_sample == 1 else \
        report.workload.unit.removesuffix("s")
    return (f"pytest-dlperf: MFU BELOW MINIMUM in {report.case}: MFU {report.mfu:.1%} is below "
            f"min_mfu {minimum:.1%} (@pytest.mark.dlperf): "
            f"{format_flops(report.achieved_flops_per_s)} per device achieved "
            f"({format_flops(flops.per_unit, '')} per {one} x {per_device:,.2f} "
            f"{report.workload.unit}/s per device) of {peak.device}'s "
            f"{format_flops(peak.flops_per_s)} {peak.precision} dense peak")


def min_mfu_unknown(report: CaseReport, minimum: float) -> str:
    if report.flops is None or report.flops.per_sample is None:
        why = (f"its FLOPs per sample are unknown ({report.flops.problem})"
               if report.flops is not None else "its FLOPs per sample are unknown")
    elif report.peak is not None and report.peak.device == MEASURED:
        why = ("this CPU's MFU is taken against a dense GEMM measured on it, not the hardware's "
               "peak; give a core's peak FLOP/s with --dlperf-peak-flops to hold a floor")
    else:
        why = ("this device's peak FLOP/s is unknown (GPUs outside the built-in table); "
               "give it with --dlperf-peak-flops")
    return (f"pytest-dlperf: {report.case}: min_mfu {minimum:.1%} (@pytest.mark.dlperf) is not "
            f"checked: {why}")


def refusal(within_cv: float | None, df: int, policy: Policy,
            efficiency: float | None) -> str | None:
    """Why a recording run does not write the baseline it asked for: launches that measured
    nothing (their own windows too far apart), or an efficiency no layout reaches (a slow
    reference); the case then fails saying so (decide). Launches far apart are the drift the
    verdict models, not a reason."""
    if unstable.too_unstable_to_record(within_cv, policy.unstable_cv, df):
        return "unstable"
    return "efficiency" if superlinear.refuses(efficiency) else None
