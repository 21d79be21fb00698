"""The case record: everything a case measured and what it was judged, built once and complete
(``plugin.meter`` builds it after every figure is known), then judged (``decide``), reported
(``report``) and kept (``store``). ``metrics`` gives its figures as the stores keep them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.batchsearch import Search
from ..core.facts import Facts
from ..core.parallel import DATA_PARALLEL, Layout
from ..core.phases import Phases
from ..core.protocol import Protocol, Result, median_of_launches, split
from ..core.topology import Topology
from ..core.workload import CaseWorkload, Precision
from ..store.baselines import EFFICIENCY, MEMORY, THROUGHPUT, Change, Metric
from .changepoints import Step
from .mfu import FlopsCount, Peak
from .position import FirstLaunchApart
from .scaling import ScalingModel
from .stats import Verdict


@dataclass(frozen=True)
class CaseReport:
    """Every field reads by attribute: ``report.result.median``, ``report.environment.python``
    (the mappings, ``Facts``, read by key too). docs/writing-tests.md lists them."""

    case: str  # the nodeid: "perf_tests/test_resnet50_torch.py::test_resnet50_v15[1n2d-fp32]"
    name: str
    nodeid: str
    params: Facts  # argname -> value as JSON (a topology by its id)
    framework: str
    framework_version: str
    topology: Topology
    precision: Precision
    workload: CaseWorkload
    protocol: Protocol
    result: Result
    verdict: Verdict
    baseline_path: str | None = None
    baseline_change: Change | None = None  # set when this run wrote (or kept) its baseline
    fingerprint: Facts = field(default_factory=Facts)
    environment: Facts = field(default_factory=Facts)
    launched_at: float = 0.0  # epoch seconds when the case's processes were started
    launcher: str = "local"
    isolation: str | None = None  # local mode: "network-namespace" or "none"
    # between the nodes: their addresses, the link asked for and measured (launcher.network)
    network: Facts = field(default_factory=Facts)
    # Multi-device cases: median / the 1n1d median with the same per-device batch, and / devices.
    speedup: float | None = None
    efficiency: float | None = None
    efficiency_verdict: Verdict | None = None
    memory_verdict: Verdict | None = None  # peak memory (lower is better); None: not measured
    batch_search: Search | None = None  # --dlperf-batch-size max: how the batch was found
    flops: FlopsCount | None = None  # FLOPs per sample and where they came from
    achieved_flops_per_s: float | None = None  # per device
    peak: Peak | None = None  # the device's dense peak the MFU is taken against
    mfu: float | None = None
    mfu_missing: str | None = None  # why there is no MFU
    reference: float | None = None  # the 1n1d median the speedup is taken against
    cv: float = 0.0  # coefficient of variation of the repeats
    # Of windows around their own launch's mean, pooled over the launches (None: no launch
    # timed two windows): whether a launch measured anything (``unstable.too_unstable_to_record``).
    within_cv: float | None = None
    compiler: str = "eager"
    layout: Layout = DATA_PARALLEL  # how the ranks shared the work
    param: str = ""  # pytest's parameter id (callspec.id)
    machine: str = ""  # --dlperf-machine: whose baselines judge this case
    other_machines: list[str] = field(default_factory=list)  # with a baseline of this case
    unnamed_baselines: str | None = None  # this case's baselines from before machines were named
    # How this machine's nearest baseline of the case differs from this fingerprint.
    other_fingerprint: str | None = None
    # --dlperf-history: runs of this case and fingerprint in it (this one included), the steps
    # of each metric over them, and the one tonight sits after unaccepted (it fails the case).
    history_runs: int | None = None
    history_steps: list[Step] = field(default_factory=list)
    history_blocking: Step | None = None
    # --dlperf-update-baselines asked for a baseline that was not written, and why: "unstable"
    # (the windows of its launches too far apart, above --dlperf-unstable-cv, for a baseline to
    # judge anything) or "efficiency" (far above linear: verdict.superlinear); None: not refused.
    record_refused: str | None = None
    # --dlperf-ab / --dlperf-ab-python: the base side, each side's figures, the pairs; the
    # verdict is then head against base (verdict.paired), and no baseline was read.
    ab: Facts = field(default_factory=Facts)
    # The baseline's phases (what its recording run's diagnostic steps measured), and the
    # scaling model held against this case's efficiency (verdict.scaling); None: none.
    baseline_phases: Phases | None = None
    scaling_model: ScalingModel | None = None
    scaling_warning: str | None = None  # the measured efficiency far below the model's
    # The first launch of each run apart from the others, over the baseline's runs and this
    # one's (verdict.position); None: alike, or too few runs to tell.
    launch_position: FirstLaunchApart | None = None
    # A sweep's rung (docs/sweeps.md): the size, this case's value, the ladder; empty: none.
    sweep: Facts = field(default_factory=Facts)

    @property
    def phases(self) -> Phases | None:
        """Where this case's step time went (its diagnostic steps); None: none ran."""
        return self.result.phases.figures() if self.result.phases is not None else None

    def __post_init__(self) -> None:
        # Built from plain dicts too (tests, a user's own tooling): one kind of field, always.
        for name in ("params", "fingerprint", "environment", "ab", "sweep"):
            value = getattr(self, name)
            if not isinstance(value, Facts):
                object.__setattr__(self, name, Facts(value))

    @property
    def baseline_action(self) -> str | None:
        return self.baseline_change.action if self.baseline_change else None

    @property
    def verdict_text(self) -> str:
        if self.baseline_action:
            return self.baseline_action
        if self.record_refused:
            return f"not recorded ({self.record_refused})"
        text = self.verdict.outcome
        for name, other in (("efficiency", self.efficiency_verdict),
                            ("memory", self.memory_verdict)):
            if other is not None and other.outcome in ("regression", "inconclusive"):
                what = f"{name} {other.outcome}"
                text = what if text == "pass" else f"{text}, {what}"
        step = self.history_blocking
        if step is not None:
            what = f"{step.name} step {step.point.change:+.1%}"
            text = what if text == "pass" else f"{text}, {what}"
        return text

    def baseline_update(self) -> dict[str, Any] | None:
        change = self.baseline_change
        if change is None:
            return None
        old = change.old.throughput.median if change.old else None
        return {"action": change.action, "path": self.baseline_path,
                "old_median": old, "new_median": change.new.throughput.median,
                "backup": str(change.backup) if change.backup else None,
                "launches": change.new.launch_count, "runs": len(change.new.runs),
                "migrated_from": str(change.migrated_from) if change.migrated_from else None}

    @property
    def metrics(self) -> dict[str, Metric]:
        """The case's figures as the baseline and the history keep them."""
        return case_metrics(self.result, self.workload.unit, self.topology.world_size,
                            self.reference)


def efficiencies(samples: Sequence[float], reference: float, devices: int) -> list[float]:
    """Per-window scaling efficiency: each window's samples/s over (1n1d median x devices)."""
    return [rate / (reference * devices) for rate in samples]


def case_metrics(result: Result, unit: str, devices: int,
                 reference: float | None) -> dict[str, Metric]:
    """A case's figures as the baseline (and the history) keep them: every window's, by launch.
    Throughput always; scaling efficiency of a multi-device case with its 1n1d reference; peak
    memory where the ranks measured it."""
    metrics = {THROUGHPUT: Metric(result.launches, result.median, True, f"{unit}/s")}
    if reference is not None and devices > 1:
        samples = efficiencies(result.samples_per_s, reference, devices)
        metrics[EFFICIENCY] = Metric(split(samples, result.windows_per_launch),
                                     result.median / reference / devices, True, "fraction")
    if result.memory_bytes:
        launches = result.memory_launches
        metrics[MEMORY] = Metric(launches, median_of_launches(launches), False, "bytes")
    return metrics
