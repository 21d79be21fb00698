"""One case end to end, on the pytest side: run the workload on the cluster, aggregate the ranks,
fingerprint, compare the repeats with the baseline's (throughput and scaling efficiency), add
repeats while the verdict is inconclusive, record, and fail the test that regressed. The ``throughput_meter`` fixture hands a test a ``ThroughputMeter``."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from . import frameworks
from .baselines import EFFICIENCY, THROUGHPUT, Baseline, BaselineError, Change, Metric
from .launch import Cluster, LaunchError
from .protocol import Result, aggregate
from .report import CaseReport
from .session import SessionState
from .settings import parse_marker
from .stats import (IMPROVEMENT, INCONCLUSIVE, NO_BASELINE, REGRESSION, Verdict,
                    coefficient_of_variation, compare, look_alpha)
from .topology import Topology, fingerprint, make_topology
from .workload import Precision, Workload, default_workload


class DLPerfWarning(pytest.PytestWarning):
    """A case passed but something about its figures deserves a look."""


class ThroughputMeter:
    def __init__(self, node: pytest.Item, cluster: Cluster, amp: Precision,
                 state: SessionState) -> None:
        self.node, self.cluster, self.amp, self.state = node, cluster, amp, state
        self.protocol = state.settings.protocol

    @property
    def case(self) -> str:
        return f"{self.node.path.name}::{self.node.name}"

    @property
    def compiler(self) -> str:
        return _params(self.node).get("compiler", "eager")

    def _check_compiler(self, framework: str) -> None:
        if self.compiler == "eager":
            return
        if self.protocol.warmup_steps < 1:
            pytest.fail(f"pytest-dlperf: {self.case}: a compiled case needs at least one warm-up "
                        "step (compilation happens in the first step, which is never timed); "
                        "raise --dlperf-warmup-steps", pytrace=False)
        reason = self._unavailable(framework, "compile_unavailable")
        if reason:
            pytest.skip(f"{framework} cannot compile on {self.cluster.device_type} here: {reason}")

    def _check_amp(self, framework: str) -> None:
        reason = self._unavailable(framework, "amp_unavailable") if self.amp.enabled else None
        if reason:
            pytest.skip(f"{framework} has no AMP on {self.cluster.device_type}: {reason}")

    def _unavailable(self, framework: str, hook: str) -> str | None:
        """The adapter's reason why a mode cannot run on this device type (optional hooks)."""
        check = getattr(frameworks.load(framework), hook, None)
        return check(self.cluster.device_type) if check is not None else None

    def measure(self, framework: str, model: str = "resnet50", *, batch_size: int | None = None,
                image_size: int | None = None, lr_per_256: float | None = None) -> CaseReport:
        """Train ``model`` with ``framework`` on every rank, apply the protocol, compare the
        median (and a multi-device case's scaling efficiency) with the baseline, failing this
        test on a regression, and return the record."""
        try:
            frameworks.check_model(framework, model)
        except LookupError as exc:
            pytest.fail(f"pytest-dlperf: {self.node.nodeid}: {exc}", pytrace=False)
        version = self._framework_version(framework)
        self._check_amp(framework)
        self._check_compiler(framework)
        workload = default_workload(model, self.cluster.device_type, self.amp.enabled,
                                    batch_size, image_size, lr_per_256)
        launched_at = time.time()
        result, env = self._run(self.cluster, framework, workload)
        fp = self._fingerprint(self.cluster.topology, framework, version, env, workload)
        baseline = self._load_baseline(self.case, fp)
        tolerance = self._tolerance(baseline)
        reference = (self._reference_median(framework, version, env, workload)
                     if self.cluster.world_size > 1 else None)
        verdict, efficiency = self._verdicts(result, baseline, reference, tolerance)
        while self._needs_more(verdict, efficiency, result):
            more = min(self.protocol.repeats, self.state.settings.max_repeats - len(result.window_s))
            result = result.extended(self._run(self.cluster, framework, workload, more)[0])
            verdict, efficiency = self._verdicts(result, baseline, reference, tolerance)
        report = CaseReport(
            case=self.case, name=self.node.name, nodeid=self.node.nodeid,
            params=_params(self.node), framework=framework,
            framework_version=str(env.get("framework_version", version)),
            topology=self.cluster.topology, precision=self.amp, workload=workload,
            protocol=self.protocol, result=result, fingerprint=fp, environment=env,
            verdict=verdict, efficiency_verdict=efficiency,
            baseline_path=self._display(self.state.store.path_for(self.case, fp)),
            launched_at=launched_at, launcher=self.cluster.launcher.name,
            isolation=self.cluster.launcher.isolation,
            cv=coefficient_of_variation(result.samples_per_s), compiler=self.compiler)
        if reference is not None:
            report.reference = reference
            report.speedup = result.median / reference
            report.efficiency = report.speedup / self.cluster.world_size
        if self.cluster.launcher.is_reporter:
            report.baseline_change = self._maybe_update(report, baseline)
            self.state.reports.append(report)
        self._conclude(report)
        return report

    def _verdicts(self, result: Result, baseline: Baseline | None, reference: float | None,
                  tolerance: float) -> tuple[Verdict, Verdict | None]:
        """Throughput, and a multi-device case's scaling efficiency, each sample against the
        baseline's samples (efficiency per window: its samples/s over the 1n1d median)."""
        alpha = look_alpha(self._looks)
        verdict = compare(result.samples_per_s, baseline.throughput.repeats if baseline else None,
                          tolerance, alpha=alpha)
        if reference is None or baseline is None or baseline.efficiency is None:
            return verdict, None
        return verdict, compare(_efficiencies(result, reference, self.cluster.world_size),
                                baseline.efficiency.repeats, tolerance, alpha=alpha)

    @property
    def _looks(self) -> int:
        """How many times a verdict may be taken: once, then once per batch of extra repeats."""
        if not self.cluster.launcher.can_add_repeats:
            return 1
        extra = max(0, self.state.settings.max_repeats - self.protocol.repeats)
        return 1 + -(-extra // self.protocol.repeats)

    def _needs_more(self, verdict: Verdict, efficiency: Verdict | None, result: Result) -> bool:
        """An inconclusive verdict gets more windows, up to --dlperf-max-repeats; not once either
        figure is a proven regression, not while recording baselines, and not in external mode
        (every rank would have to agree)."""
        outcomes = (verdict.outcome, efficiency.outcome if efficiency else None)
        # A proven regression of either figure decides the case: more windows cannot undo it.
        return (INCONCLUSIVE in outcomes and REGRESSION not in outcomes
                and self.state.settings.update_baselines != "all"
                and self.cluster.launcher.can_add_repeats
                and len(result.window_s) < self.state.settings.max_repeats)

    def _conclude(self, report: CaseReport) -> None:
        """Judge the case; in external mode only rank 0 judges and the others take its word."""
        launcher, timeout = self.cluster.launcher, self.state.settings.timeout
        if not launcher.is_reporter:
            outcome = launcher.share_outcome({}, timeout)
            if outcome["status"] == "failed":
                pytest.fail(f"pytest-dlperf (rank 0's verdict): {outcome['message']}",
                            pytrace=False)
            return
        try:
            self._judge(report)
        except pytest.fail.Exception as exc:
            launcher.share_outcome({"status": "failed", "message": str(exc.msg)}, timeout)
            raise
        launcher.share_outcome({"status": "passed", "message": ""}, timeout)

    def _run(self, cluster: Cluster, framework: str, workload: Workload,
             repeats: int | None = None) -> tuple[Result, dict[str, Any]]:
        protocol = self.protocol if repeats is None else replace(self.protocol, repeats=repeats)
        spec = {"framework": framework, "precision": self.amp.name, "compiler": self.compiler,
                "protocol": protocol.to_json(), **workload.to_spec(cluster.world_size)}
        started = time.perf_counter()
        try:
            ranks = cluster.run(spec)
        except LaunchError as exc:
            pytest.fail(f"pytest-dlperf: {self.case} {exc.kind} on {cluster.topology.id}: "
                        f"{exc}", pytrace=False)
        env = dict(ranks[0]["environment"])
        hardware = self.state.hardware
        if cluster.device_type == "cuda":  # what NVML says, beside what the framework saw
            env.update(driver=hardware.gpu_driver, gpu_memory_bytes=list(hardware.gpu_memory))
        return aggregate(ranks, workload.batch_size, time.perf_counter() - started), env

    def _fingerprint(self, topology: Topology, framework: str, version: str, env: dict[str, Any],
                     workload: Workload) -> dict[str, Any]:
        return fingerprint(topology, framework=framework,
                           framework_version=str(env.get("framework_version", version)),
                           precision=self.amp.name, model=workload.model,
                           batch_size=workload.batch_size, image_size=workload.image_size,
                           protocol_slug=self.protocol.slug,
                           accelerator_stack=self._accelerator_stack(topology, env),
                           compiler=self.compiler)

    def _reference_median(self, framework: str, version: str, env: dict[str, Any],
                          workload: Workload) -> float | None:
        """The 1n1d median for this test and precision, with the same per-device batch: from
        this session, else from its baseline, else measured now (and not reported); None when
        the launcher cannot run 1n1d (external mode) and nothing else has it."""
        topology = make_topology(self.state.hardware, 1, 1, self.cluster.device_type)
        fp = self._fingerprint(topology, framework, version, env, workload)
        case = self._case_at(topology)
        for report in self.state.reports:
            if report.case == case and report.fingerprint == fp:
                return report.result.median
        try:
            baseline = self.state.store.load(case, fp) if case else None
        except BaselineError:
            baseline = None
        if baseline is not None:
            return baseline.throughput.median
        if not self.cluster.launcher.can_run(topology):
            return None
        return self._run(self.cluster.at(topology), framework, workload)[0].median

    def _case_at(self, topology: Topology) -> str | None:
        """This test's case id with its ``cluster`` parameter moved to ``topology``."""
        params = _params(self.node)
        if "cluster" not in params:
            return None
        params["cluster"] = topology.id
        name = getattr(self.node, "originalname", self.node.name)
        return f"{self.node.path.name}::{name}[{'-'.join(params.values())}]"

    def _framework_version(self, framework: str) -> str:
        python = self.cluster.pythons.get(framework)
        try:
            version = frameworks.installed_version(framework, python)
        except (LookupError, RuntimeError) as exc:
            where = f" (--dlperf-python {framework}={python})" if python else ""
            pytest.fail(f"pytest-dlperf: {self.node.nodeid}: {exc}{where}", pytrace=False)
        if version is None and python:
            pytest.fail(f"pytest-dlperf: {self.node.nodeid}: {framework} is not installed in "
                        f"its worker interpreter {python} (--dlperf-python); "
                        f"{frameworks.install_hint(framework)}", pytrace=False)
        if version is None:
            pytest.skip(f"{framework} is not installed in pytest's interpreter and no "
                        f"--dlperf-python {framework}=PATH is given; "
                        f"{frameworks.install_hint(framework)}")
        return version

    def _accelerator_stack(self, topology: Topology, env: dict[str, Any]) -> str | None:
        if topology.device_type != "cuda":
            return None
        return (f"cuda{env.get('cuda')}-cudnn{env.get('cudnn')}-nccl{env.get('nccl')}"
                f"-driver{self.state.hardware.gpu_driver}")

    def _load_baseline(self, case: str, fp: dict[str, Any]) -> Baseline | None:
        try:
            return self.state.store.load(case, fp)
        except BaselineError as exc:
            if self.state.settings.update_baselines == "all":
                return None  # replaced below; the unreadable file is kept as .bak
            pytest.fail(f"pytest-dlperf: {exc}", pytrace=False)

    def _tolerance(self, baseline: Baseline | None) -> float:
        marker = self.node.get_closest_marker("dlperf")
        tolerance = parse_marker(marker, self.node.nodeid).get("tolerance") if marker else None
        if tolerance is not None:
            return float(tolerance)
        if baseline is not None and baseline.tolerance is not None:
            return baseline.tolerance
        return self.state.settings.tolerance

    def _maybe_update(self, report: CaseReport, baseline: Baseline | None) -> Change | None:
        mode = self.state.settings.update_baselines
        if mode is None or (mode == "missing" and baseline is not None):
            return None
        result = report.result
        metrics = {THROUGHPUT: Metric(result.samples_per_s, result.median, True, "samples/s")}
        if report.efficiency is not None and report.reference is not None:
            samples = _efficiencies(result, report.reference, report.topology.world_size)
            metrics[EFFICIENCY] = Metric(samples, report.efficiency, True, "fraction")
        try:
            return self.state.store.update(
                Baseline(case=self.case, fingerprint=report.fingerprint, metrics=metrics,
                         recorded=_recorded(report)),
                only_missing=mode == "missing")
        except BaselineError as exc:
            pytest.fail(f"pytest-dlperf: {exc}", pytrace=False)

    def _judge(self, report: CaseReport) -> None:
        verdict, where = report.verdict, report.baseline_path
        self._warn_unstable(report)  # recording a noisy baseline deserves the warning most
        if report.baseline_change is not None:
            return
        if verdict.outcome == REGRESSION:
            pytest.fail(regression_message(report), pytrace=False)
        efficiency = report.efficiency_verdict
        if efficiency is not None and efficiency.outcome == REGRESSION:
            pytest.fail(
                f"pytest-dlperf: SCALING REGRESSION in {self.case}: scaling efficiency "
                f"{efficiency.measured:.1%} (speedup {report.speedup:.2f} on "
                f"{report.topology.world_size} devices) is below the threshold "
                f"{efficiency.threshold:.1%} (baseline {efficiency.baseline:.1%} from {where}, "
                f"tolerance {efficiency.tolerance:.1%}; {efficiency.evidence})", pytrace=False)
        for what, v in (("samples/s", verdict), ("scaling efficiency", efficiency)):
            if v is not None and v.outcome == INCONCLUSIVE:
                self._inconclusive(report, what, v)
        if verdict.outcome == NO_BASELINE:
            message = (f"pytest-dlperf: no baseline for {self.case} on this fingerprint "
                       f"(expected {where}); measured {verdict.measured:,.2f} samples/s; "
                       "record one with --dlperf-update-baselines")
            if self.state.settings.strict:
                pytest.fail(message + " (failing: --dlperf-strict)", pytrace=False)
            self.node.warn(DLPerfWarning(message))
        elif verdict.outcome == IMPROVEMENT:
            self.node.warn(DLPerfWarning(
                f"pytest-dlperf: {self.case} is {verdict.delta:+.1%} faster than its baseline "
                f"({verdict.measured:,.2f} vs {verdict.baseline:,.2f} samples/s; "
                f"{verdict.evidence}); consider --dlperf-update-baselines"))

    def _inconclusive(self, report: CaseReport, what: str, v: Verdict) -> None:
        message = (
            f"pytest-dlperf: INCONCLUSIVE {self.case}: {what} median {v.measured:,.4g} is "
            f"{v.delta:+.1%} against the baseline's {v.baseline:,.4g} (beyond the tolerance "
            f"{v.tolerance:.1%}) but the difference is not significant ({v.evidence}) after "
            f"{len(report.result.window_s)} repeats (--dlperf-max-repeats "
            f"{self.state.settings.max_repeats}); rerun on a quieter machine, raise "
            "--dlperf-max-repeats or --dlperf-steps")
        if self.state.settings.strict:
            pytest.fail(message + " (failing: --dlperf-strict)", pytrace=False)
        self.node.warn(DLPerfWarning(message))

    def _warn_unstable(self, report: CaseReport) -> None:
        limit = self.state.settings.unstable_cv
        if report.cv > limit:
            samples = report.result.samples_per_s
            self.node.warn(DLPerfWarning(
                f"pytest-dlperf: {self.case} is unstable: its {len(samples)} repeats vary by "
                f"{report.cv:.1%} (coefficient of variation; --dlperf-unstable-cv {limit:.0%}), "
                f"from {min(samples):,.2f} to {max(samples):,.2f} samples/s; its verdict is "
                "weaker for it. Quiet the machine (other jobs, CPU frequency scaling), or "
                "lengthen the windows with --dlperf-steps"))

    def _display(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.state.rootpath))
        except ValueError:
            return str(path)


def regression_message(report: CaseReport) -> str:
    v: Verdict = report.verdict
    repeats = ", ".join(f"{x:,.2f}" for x in report.result.samples_per_s)
    return (f"pytest-dlperf: REGRESSION in {report.case}: samples/s median {v.measured:,.2f} is "
            f"below the threshold {v.threshold:,.2f} (baseline median {v.baseline:,.2f} from "
            f"{report.baseline_path}, tolerance {v.tolerance:.1%}, delta {v.delta:+.1%}) and "
            f"the drop is significant ({v.evidence}); repeats: [{repeats}]")


def _efficiencies(result: Result, reference: float, devices: int) -> list[float]:
    """Per-window scaling efficiency: each window's samples/s over (1n1d median x devices)."""
    return [rate / (reference * devices) for rate in result.samples_per_s]


def _params(node: pytest.Item) -> dict[str, str]:
    callspec = getattr(node, "callspec", None)
    if callspec is None:
        return {}
    return {k: getattr(v, "id", str(v)) for k, v in callspec.params.items()}


def _recorded(report: CaseReport) -> dict[str, Any]:
    from pytest_benchmark.utils import get_commit_info

    commit = get_commit_info()
    return {
        "datetime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit.get("id"),
        "dirty": commit.get("dirty"),
        "environment": report.environment,
        "protocol": report.protocol.to_json(),
    }
