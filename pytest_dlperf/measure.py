"""One case end to end, on the pytest side: run the workload on the cluster, aggregate the ranks,
fingerprint, compare with the baseline (throughput and scaling efficiency), record, and fail the
test that regressed. The ``throughput_meter`` fixture hands a test a ``ThroughputMeter``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from . import frameworks
from .baselines import Baseline, BaselineError
from .launch import Cluster, LaunchError
from .protocol import Result, aggregate
from .report import CaseReport
from .session import SessionState
from .settings import parse_fraction
from .stats import IMPROVEMENT, NO_BASELINE, REGRESSION, Verdict, compare
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

    def measure(self, framework: str, model: str = "resnet50", *, batch_size: int | None = None,
                image_size: int | None = None, lr_per_256: float | None = None) -> CaseReport:
        """Train ``model`` with ``framework`` on every rank, apply the protocol, compare the
        median (and a multi-device case's scaling efficiency) with the baseline, failing this
        test on a regression, and return the record."""
        version = self._framework_version(framework)
        workload = default_workload(model, self.cluster.device_type, self.amp.enabled,
                                    batch_size, image_size, lr_per_256)
        launched_at = time.time()
        result, env = self._run(self.cluster, framework, workload)
        fp = self._fingerprint(self.cluster.topology, framework, version, env, workload)
        baseline = self._load_baseline(self.case, fp)
        tolerance = self._tolerance(baseline)
        report = CaseReport(
            case=self.case, name=self.node.name, nodeid=self.node.nodeid,
            params=_params(self.node), framework=framework,
            framework_version=str(env.get("framework_version", version)),
            topology=self.cluster.topology, precision=self.amp, workload=workload,
            protocol=self.protocol, result=result, fingerprint=fp, environment=env,
            verdict=compare(result.median, baseline.median if baseline else None, tolerance),
            baseline_path=self._display(self.state.store.path_for(self.case, fp)),
            launched_at=launched_at, launcher=self.cluster.launcher.name,
            isolation=self.cluster.launcher.isolation)
        reference = (self._reference_median(framework, version, env, workload)
                     if self.cluster.world_size > 1 else None)
        if reference is not None:
            report.speedup = result.median / reference
            report.efficiency = report.speedup / self.cluster.world_size
            if baseline is not None and baseline.efficiency is not None:
                report.efficiency_verdict = compare(report.efficiency, baseline.efficiency,
                                                    tolerance)
        if self.cluster.launcher.is_reporter:
            report.baseline_action = self._maybe_update(report, baseline)
            self.state.reports.append(report)
        self._conclude(report)
        return report

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

    def _run(self, cluster: Cluster, framework: str, workload: Workload) -> tuple[Result, dict[str, Any]]:
        spec = {"framework": framework, "precision": self.amp.name,
                "protocol": self.protocol.to_json(), **workload.to_spec(cluster.world_size)}
        started = time.perf_counter()
        try:
            ranks = cluster.run(spec)
        except LaunchError as exc:
            pytest.fail(f"pytest-dlperf: {self.case} {exc.kind} on {cluster.topology.id}: "
                        f"{exc}", pytrace=False)
        return aggregate(ranks, workload.batch_size, time.perf_counter() - started), \
            ranks[0]["environment"]

    def _fingerprint(self, topology: Topology, framework: str, version: str, env: dict[str, Any],
                     workload: Workload) -> dict[str, Any]:
        return fingerprint(topology, framework=framework,
                           framework_version=str(env.get("framework_version", version)),
                           precision=self.amp.name, model=workload.model,
                           batch_size=workload.batch_size, image_size=workload.image_size,
                           protocol_slug=self.protocol.slug,
                           accelerator_stack=self._accelerator_stack(topology, env))

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
            return baseline.median
        if not self.cluster.launcher.can_run(topology):
            return None
        reference = Cluster(topology, self.cluster.launcher, self.cluster.work_root,
                            self.cluster.timeout_s)
        return self._run(reference, framework, workload)[0].median

    def _case_at(self, topology: Topology) -> str | None:
        """This test's case id with its ``cluster`` parameter moved to ``topology``."""
        params = _params(self.node)
        if "cluster" not in params:
            return None
        params["cluster"] = topology.id
        name = getattr(self.node, "originalname", self.node.name)
        return f"{self.node.path.name}::{name}[{'-'.join(params.values())}]"

    def _framework_version(self, framework: str) -> str:
        try:
            version = frameworks.installed_version(framework)
        except LookupError as exc:
            problem = str(exc)
        else:
            problem = ""
        if problem:
            pytest.fail(f"pytest-dlperf: {self.node.nodeid}: {problem}", pytrace=False)
        if version is None:
            pytest.skip(f"{framework} is not installed; install it (pip install "
                        f"'pytest-dlperf[{framework}]') to run this case")
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
        if marker is not None and marker.kwargs.get("tolerance") is not None:
            try:
                return parse_fraction(marker.kwargs["tolerance"])
            except ValueError as exc:
                raise pytest.UsageError(
                    f"pytest-dlperf: {self.node.nodeid}: @pytest.mark.dlperf(tolerance="
                    f"{marker.kwargs['tolerance']!r}): {exc}") from None
        if baseline is not None and baseline.tolerance is not None:
            return baseline.tolerance
        return self.state.settings.tolerance

    def _maybe_update(self, report: CaseReport, baseline: Baseline | None) -> str | None:
        mode = self.state.settings.update_baselines
        if mode is None or (mode == "missing" and baseline is not None):
            return None
        self.state.store.save(Baseline(
            case=self.case, fingerprint=report.fingerprint, repeats=report.result.samples_per_s,
            median=report.result.median, tolerance=baseline.tolerance if baseline else None,
            recorded=_recorded(report), efficiency=report.efficiency))
        return "updated" if baseline is not None else "recorded"

    def _judge(self, report: CaseReport) -> None:
        verdict, where = report.verdict, report.baseline_path
        if report.baseline_action is not None:
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
                f"tolerance {efficiency.tolerance:.1%})", pytrace=False)
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
                f"({verdict.measured:,.2f} vs {verdict.baseline:,.2f} samples/s); "
                "consider --dlperf-update-baselines"))

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
            f"{report.baseline_path}, tolerance {v.tolerance:.1%}, delta {v.delta:+.1%}); "
            f"repeats: [{repeats}]")


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
