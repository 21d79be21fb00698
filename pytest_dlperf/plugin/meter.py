"""``ThroughputMeter``: one case end to end, on the pytest side. Each step is a module of its
own (``case``: what follows from the test alone; ``launches``: launching; ``flops``;
``baseline``; ``history``); this one puts them in order, builds the case record once, complete,
and applies what ``verdict.decide`` says. The ``throughput_meter`` fixture hands a test one."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import pytest

from ..core.batchsearch import BATCH, BatchSearchError, Search, search_flag
from ..core.facts import Facts
from ..core.parallel import DATA_PARALLEL
from ..core.phases import Phases
from ..core.protocol import Result
from ..core.recipes import RecipeReference
from ..core.spec import RankSpec
from ..core.sweep import format_value
from ..core.topology import make_topology
from ..core.units import format_bytes
from ..core.workload import CaseWorkload, Precision, SizeValue, Workload
from ..launch import Cluster
from ..store.baselines import Baseline, Change, Metric
from ..verdict import busy as busy_text
from ..verdict import decide, position
from ..verdict.decide import Policy
from ..verdict.drift import Drift
from ..verdict.mfu import FlopsCount
from ..verdict.record import CaseReport, case_metrics
from ..verdict.stats import Verdict, coefficient_of_variation, within_launch_cv, within_launch_df
from . import ab, phases
from . import baseline as baselines
from . import sweep as sweeps
from .case import Case, Prepared, prepare
from .flops import Utilization, flops_key, flops_per_sample, session_gemm, utilization
from .history import Judged
from .launches import Launches, MachineBusy, OutOfMemoryAtTheEdge
from .outcome import (
    MACHINE_BUSY,
    DLPerfWarning,
    NotJudged,
    conclude,
    fail,
    follow_rank0,
    not_judged,
)
from .session import SessionState


@dataclass(frozen=True)
class Measured:
    """What the launches gave, before any judging."""

    result: Result
    environment: dict[str, Any]
    spec: RankSpec
    sized: CaseWorkload
    launched_at: float


class ThroughputMeter:
    def __init__(self, node: pytest.Item, cluster: Cluster, amp: Precision,
                 state: SessionState) -> None:
        self.node, self.cluster, self.amp, self.state = node, cluster, amp, state

    def measure(self, framework: str, workload: Workload | str = "resnet50", *,
                batch_size: int | None = None,
                sizes: Mapping[str, SizeValue] | None = None) -> CaseReport:
        """Train ``workload`` (a ``Workload``, or a built-in model's name) with ``framework`` on
        every rank, apply the protocol, compare the median (and a multi-device case's scaling
        efficiency) with the baseline, failing this test on a regression, and return the
        record. ``batch_size`` (per device) and ``sizes`` override the workload's for this
        call; ``--dlperf-batch-size`` overrides both. In A/B mode (``--dlperf-ab``) the case
        is judged head against base instead (``ab``). A case whose launch stays beside heavy
        interference (other processes' CPU, steal) fails as machine busy, not judged."""
        rung = sweeps.rung_of(self.node)
        if rung is not None:  # the rung's size, over the call's (docs/sweeps.md)
            sweeps.skip_past(self._sweep().record, rung)
            if rung.name == BATCH:
                batch_size = rung.value
            else:
                sizes = {**(sizes or {}), rung.name: rung.value}
        prepared = prepare(self.node, self.cluster, self.amp, self.state, framework, workload,
                           batch_size, sizes)
        if self.state.ab is not None:
            return ab.measure(prepared)
        try:
            return self._against_the_baseline(prepared, rung)
        except MachineBusy as busy:
            self._machine_busy(prepared.case, busy, prepared.sized.unit)
        except OutOfMemoryAtTheEdge as edge:  # a sweep's rung (a search steps down itself)
            assert rung is not None
            self._rung_out_of_memory(prepared, rung, edge)

    def _sweep(self) -> sweeps.Sweep:
        given = self.node.funcargs["sweep"]  # type: ignore[attr-defined]
        assert isinstance(given, sweeps.Sweep)
        return given

    def _rung_out_of_memory(self, prepared: Prepared, rung: sweeps.Rung,
                            edge: OutOfMemoryAtTheEdge) -> NoReturn:
        """A sweep's rung ran out of memory: the sweep's end, a result (the rungs above it
        skip), unless a baseline says this rung fit before: then a memory regression."""
        case, record = prepared.case, self._sweep().record
        record.points.append(sweeps.Point(rung.value, oom=edge.message))
        fitted = self.state.store.fitted_before(
            case.id, case.memory_match(case.framework_version(), prepared.sized))
        if fitted is not None:
            fail(f"pytest-dlperf: {case.id}: {rung.shown} ran out of memory on "
                 f"{self.cluster.topology.id}, and it fit when its baseline was recorded "
                 f"({case.display(fitted)}): a memory regression; {edge.message}")
        largest, limit = record.largest_fit, self.state.settings.memory_limit
        pytest.xfail(f"{rung.shown} ran out of memory on {self.cluster.topology.id}: the sweep "
                     f"of {rung.name} ends here (the largest that fit: "
                     f"{format_value(largest) if largest else 'none so far'}; "
                     f"--dlperf-memory-limit {format_bytes(limit) if limit else 'none'}); "
                     f"{edge.message}")

    def _against_the_baseline(self, prepared: Prepared, rung: sweeps.Rung | None
                              ) -> CaseReport:
        """Baseline mode (measure's own): a launch beside heavy interference is run again,
        and ``MachineBusy`` raised where it stays (every rank is ours on this host only). A
        sweep's rung that runs out of memory raises ``OutOfMemoryAtTheEdge``."""
        case, chosen, sized, recipe = (prepared.case, prepared.workload, prepared.sized,
                                       prepared.recipe)
        version = case.framework_version()
        case.check_modes()
        launches = Launches(case, retry_busy=self.cluster.launcher.all_nodes_here)
        search = (self._search(case, launches, version, chosen, sized, recipe, prepared.search)
                  if prepared.search else None)
        if search is not None:
            sized = at_value(sized, search.size, search.found)
        measured = self._measure(case, launches, chosen, sized, recipe, search,
                                 swept=rung is not None)
        report, policy = self._judge(case, launches, measured, chosen, version, search)
        if rung is not None:
            report = replace(report, sweep=Facts(name=rung.name, value=rung.value,
                                                 rungs=list(rung.rungs)))
            self._sweep().record.points.append(sweeps.Point(rung.value, report))
        if not self.cluster.launcher.is_reporter:
            follow_rank0(self.cluster.launcher, self.state.settings.timeout)
            return report
        self.state.reports.append(report)
        conclude(self.node, decide.decide(report, policy), self.cluster.launcher,
                 self.state.settings.timeout)
        return report

    def _machine_busy(self, case: Case, busy: MachineBusy, unit: str) -> NoReturn:
        """The case fails without a verdict: the machine, not the code, was measured (its
        figures kept for the summary and the results, marked)."""
        settings = self.state.settings
        recording = settings.update_baselines is not None
        message = busy_text.message(case.id, busy.seen, busy.label, busy.retries,
                                    settings.busy_threshold, recording)
        result = busy.measured
        measured = None if result is None else {
            "unit": unit, "median": result.median, "launches": result.launches}
        unjudged = NotJudged(case.id, MACHINE_BUSY, message, busy.label, busy.retries,
                             recording, busy.seen.to_json(), measured)
        not_judged(self.node, unjudged, self.cluster.launcher, settings.timeout)

    # -- the steps -----------------------------------------------------------------------

    def _search(self, case: Case, launches: Launches, version: str, workload: Workload,
                sized: CaseWorkload, recipe: RecipeReference | None, size: str) -> Search:
        """--dlperf-batch-size max, --dlperf-size NAME=max: from the value an earlier run found
        (its baseline's record), else from the workload's own."""
        seed = self.state.store.found_size(case.id, case.memory_match(version, sized, size),
                                           size)
        start = sized.batch_size if size == BATCH else sized.sizes[size]
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            case.fail(f"--dlperf-size {size}=max: the workload's {size} is {start!r}; only a "
                      "positive whole size can be searched")
        assert isinstance(start, int)
        return launches.search_size(
            size, lambda value: case.spec(workload, at_value(sized, size, value), recipe),
            start, seed)

    def _measure(self, case: Case, launches: Launches, workload: Workload, sized: CaseWorkload,
                 recipe: RecipeReference | None, search: Search | None, *,
                 swept: bool = False) -> Measured:
        """The run's launches; at a searched batch that runs out of memory, one batch down;
        a sweep's rung that does raises ``OutOfMemoryAtTheEdge`` (``swept``)."""
        policy = case.policy(None)
        # Judging runs launch once, then judge after every launch (``_verdicts``); recording
        # runs and a searched batch (whose launches may run out of memory) take the run's.
        first = (policy.launches if search is not None or policy.update in ("all", "add")
                 else 1)
        while True:
            spec = case.spec(workload, sized, recipe)
            if self._rank_counts_flops(case, workload, sized):
                spec = replace(spec, count_flops=True)
            launched_at = time.time()
            launches.rank_flops = None  # what this attempt's rank 0 counts, if it counts
            try:
                result, env = launches.measure(spec, [policy.windows_per_launch] * first,
                                               at_the_edge=search is not None or swept,
                                               planned=policy.launches,
                                               missed=search.missed if search else None)
                return Measured(result, env, replace(spec, count_flops=False), sized,
                                launched_at)
            except OutOfMemoryAtTheEdge as edge:
                if search is None:
                    raise
                try:
                    found = search.retreat(edge.seconds, edge.message)
                except BatchSearchError as exc:
                    case.fail(f"{search_flag(search.size)}: {exc}")
                sized = at_value(sized, search.size, found)

    def _rank_counts_flops(self, case: Case, workload: Workload, sized: CaseWorkload) -> bool:
        """Rank 0 of the first launch counts FLOPs (after its windows) where a torch rank can
        and the session has no count yet. Not under a memory limit: counting builds the model
        once more (BERT's on the CPU), memory the probes of a batch search did not use; a
        subprocess counts then."""
        key = flops_key(workload, sized, self.cluster.device_type)
        return (key not in self.state.flops_counts and workload.flops_per_sample is None
                and case.adapter.recipe_key == "torch"
                and not self.state.settings.memory_limit)

    def _judge(self, case: Case, launches: Launches, measured: Measured, workload: Workload,
               version: str, search: Search | None) -> tuple[CaseReport, Policy]:
        """Every figure of the case, its verdicts (more launches while they are
        inconclusive), the baseline recorded where the run says so, and its history: the
        record, built once."""
        sized, env = measured.sized, measured.environment
        # Counted (and kept for the session) before anything else can fail the case.
        flops = self._count_flops(case, launches, workload, measured)
        searched = search.size if search else None
        fp = case.fingerprint(self.cluster.topology, version, env, sized, searched)
        baseline = baselines.load(case, fp)
        policy = case.policy(baseline)
        scaled = self.cluster.world_size > 1 and self.state.settings.speedup == "on"
        reference, one_device = (self._reference(case, launches, measured, version, searched)
                                 if scaled else (None, None))
        result, verdicts = self._verdicts(launches, measured, baseline, reference, policy,
                                          baselines.machine_drift(case, fp))
        # Before anything is recorded: an MFU above 100% (a wrong peak) fails the case here.
        used = self._utilization(flops, measured, result)
        devices = self.cluster.world_size
        metrics = case_metrics(result, sized.unit, devices, reference)
        cv = coefficient_of_variation(result.samples_per_s)
        within_cv, df = within_launch_cv(result.launches), within_launch_df(result.launches)
        change = None
        reporter = self.cluster.launcher.is_reporter
        wants = reporter and decide.records(policy, baseline is not None)
        speedup = result.median / reference if reference is not None else None
        efficiency = speedup / devices if speedup is not None else None
        refused = decide.refusal(within_cv, df, policy, efficiency) if wants else None
        if wants and not refused:
            recorded = baselines.recorded(env, case.protocol, search, self.state.commit,
                                          phases.of(result))
            change = baselines.record(case, fp, metrics, recorded,
                                      len(result.windows_per_launch), policy.update,
                                      policy.keep_launches)
        history = (self._history(case, fp, metrics, verdicts[0], change)
                   if reporter and self.state.history is not None else None)
        elsewhere = baselines.elsewhere(case, fp) if baseline is None else None
        model = self._scaling_model(one_device, result, speedup)
        report = CaseReport(
            **case.identity(version, env, sized, fp), result=result,
            verdict=verdicts[0], efficiency_verdict=verdicts[1], memory_verdict=verdicts[2],
            baseline_path=case.display(self.state.store.path_for(case.id, fp)),
            baseline_change=change, launched_at=measured.launched_at,
            cv=cv, within_cv=within_cv, record_refused=refused, batch_search=search,
            **(elsewhere.fields() if elsewhere else {}),
            reference=reference, speedup=speedup,
            efficiency=efficiency,
            flops=flops, achieved_flops_per_s=used.achieved_flops_per_s, peak=used.peak,
            mfu=used.mfu, mfu_missing=used.missing,
            history_runs=history.runs if history else None,
            history_steps=list(history.steps) if history else [],
            history_blocking=history.blocking if history else None,
            baseline_phases=baselines.recorded_phases(baseline),
            scaling_model=model.model if model else None,
            scaling_warning=model.warning if model else None,
            launch_position=self._position(baseline, result, policy))
        return report, policy

    def _scaling_model(self, one_device: Phases | None, result: Result,
                       speedup: float | None) -> phases.Scaled | None:
        """The scaling model held against a multi-device case's efficiency (None: none)."""
        threads = make_topology(self.state.hardware, 1, 1,
                                self.cluster.device_type).threads_per_worker
        return phases.scaling(self.cluster, one_device, result, speedup, threads)

    @staticmethod
    def _position(baseline: Baseline | None, result: Result, policy: Policy
                  ) -> position.FirstLaunchApart | None:
        """The first launch of each run apart from the others: over the baseline's runs, and
        this run's where it took enough launches (verdict.position). A baseline without an
        allocator in its fingerprint was recorded before launches started alike (its launch 1
        counted FLOPs first): its runs are not evidence of the workload's own."""
        runs = ([] if baseline is None or "allocator" not in baseline.fingerprint
                else position.baseline_runs(baseline.throughput.launches,
                                            [run.launches for run in baseline.runs],
                                            policy.keep_launches))
        return position.first_launch_apart([*runs, result.launches])

    def _history(self, case: Case, fp: dict[str, Any], metrics: dict[str, Metric],
                 verdict: Verdict, change: Change | None) -> Judged:
        """This run added to the history, judged by it (a step it sits after)."""
        assert self.state.history is not None
        history = self.state.history.judge(case.id, fp, metrics, verdict.outcome,
                                           change.action if change else None)
        if history.unread:
            self.node.warn(DLPerfWarning(history.unread))
        return history

    def _verdicts(self, launches: Launches, measured: Measured, baseline: Any,
                  reference: float | None, policy: Policy, drifts: dict[str, Drift]
                  ) -> tuple[Result, tuple[Verdict, Verdict | None, Verdict | None]]:
        """Throughput, scaling efficiency and memory against the baseline (``drifts``: the
        machine's drift between runs), judged after every launch: more launches until the
        run's are done or every figure is settled, and beyond them while a figure is
        inconclusive and more launches can settle it."""
        devices = self.cluster.world_size

        def judge(result: Result) -> tuple[Verdict, Verdict | None, Verdict | None]:
            verdict, efficiency = decide.verdicts(
                result.samples_per_s, result.windows_per_launch, baseline, reference, devices,
                policy.tolerance, policy, drifts)
            memory = decide.memory_verdict(result.memory_launches, baseline,
                                           policy.memory_tolerance, policy)
            return verdict, efficiency, memory

        result = measured.result
        verdicts = judge(result)
        while more := decide.next_launches(verdicts, len(result.windows_per_launch), policy):
            result = result.extended(launches.measure(
                measured.spec, more, done=len(result.windows_per_launch),
                planned=policy.launches)[0])
            verdicts = judge(result)
        return result, verdicts

    def _reference(self, case: Case, launches: Launches, measured: Measured,
                   version: str, searched: str | None) -> tuple[float | None, Phases | None]:
        """The 1n1d median for this test and precision, with the same per-device batch, and
        its phases: from this session, else from its baseline, else measured now (not
        reported, once a session); None where nothing has it and the launcher cannot run 1n1d."""
        topology = make_topology(self.state.hardware, 1, 1, self.cluster.device_type)
        # As the 1n1d case itself is filed: a searched batch's fingerprint says "max"; one
        # device trains alone, whatever this case's layout (DLPerf's speedup's denominator).
        fp = case.fingerprint(topology, version, measured.environment, measured.sized, searched,
                              layout=DATA_PARALLEL)
        found = baselines.reference_median(case, self.state.case_at(self.node, topology), fp)
        if found is not None:
            return found
        if not self.cluster.launcher.can_run(topology):
            return None, None
        # Once a session: cases whose reference trains the same (dp's, fsdp2's) share it.
        key = launches.reference_spec(measured.spec).with_(count_flops=False).dumps()
        if key in self.state.references:
            return self.state.references[key]
        try:
            single = launches.reference_result(measured.spec, topology, at_the_edge=True)
        except OutOfMemoryAtTheEdge as edge:
            self.node.warn(DLPerfWarning(
                f"pytest-dlperf: {case.id}: no speedup: one device alone (its 1n1d reference) "
                f"ran out of memory at this size: {edge.message}"))
            return None, None
        kept = self.state.references[key] = single.median, phases.of(single)
        return kept

    def _count_flops(self, case: Case, launches: Launches, workload: Workload,
                     measured: Measured) -> FlopsCount:
        """FLOPs per sample, counted once per session and key."""
        key = flops_key(workload, measured.sized, self.cluster.device_type)
        counts = self.state.flops_counts
        if key not in counts:
            counts[key] = flops_per_sample(workload, measured.sized, case.protocol,
                                           self.cluster.device_type, launches.rank_flops,
                                           self.state.work_root)
        return counts[key]

    def _utilization(self, flops: FlopsCount, measured: Measured,
                     result: Result) -> Utilization:
        """Achieved FLOP/s per device and, where the device's peak is known, MFU."""
        gpus = self.state.hardware.gpus
        device = gpus[0] if self.cluster.device_type == "cuda" and gpus else None
        per_device = result.median / self.cluster.world_size
        threads = measured.environment.get("threads") or self.cluster.topology.threads_per_worker
        return utilization(flops, per_device, self.amp.dtype, measured.environment, device,
                           self.state.settings.peak_flops, device_type=self.cluster.device_type,
                           threads=int(threads),
                           gemm=lambda: session_gemm(self.state))


def at_value(sized: CaseWorkload, size: str, value: int) -> CaseWorkload:
    """``sized`` with ``size`` (the batch, or one of its sizes) at ``value``."""
    if size == BATCH:
        return replace(sized, batch_size=value)
    return replace(sized, sizes={**sized.sizes, size: value})


__all__ = ["DLPerfWarning", "ThroughputMeter"]
