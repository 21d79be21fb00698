"""pytest wiring for pytest-dlperf: options, markers, fixtures, parametrization and reports.

Everything this module calls lives in a module named after its concept; nothing here imports a
deep-learning framework, so ``pytest --help`` stays cheap.
"""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import frameworks
from . import settings as settings_mod
from .baselines import Baseline, BaselineError, BaselineStore
from .jsonio import write_json_atomic
from .launch import Cluster, LaunchError, Launcher, detect, get_launcher
from .protocol import Result, aggregate
from .report import CaseReport, results_json, rows, text_table
from .stats import IMPROVEMENT, NO_BASELINE, REGRESSION, Verdict, compare
from .topology import Hardware, Topology, detect_hardware, fingerprint, make_topology
from .workload import PRECISIONS, Precision, Workload, default_workload


class DLPerfWarning(pytest.PytestWarning):
    """A case passed but something about its figures deserves a look."""


@dataclass
class SessionState:
    settings: settings_mod.Settings
    store: BaselineStore
    rootpath: Path
    reports: list[CaseReport] = field(default_factory=list)
    _hardware: Hardware | None = None
    _work_root: Path | None = None
    _launcher: Launcher | None = None

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            name = self.settings.launcher
            try:
                self._launcher = get_launcher(detect(dict(os.environ)) if name == "auto" else name,
                                              dict(os.environ))
            except LookupError as exc:
                raise pytest.UsageError(f"pytest-dlperf: {exc}") from None
        return self._launcher

    @property
    def hardware(self) -> Hardware:
        if self._hardware is None:  # lazily: only sessions that run cases pay for detection
            self._hardware = detect_hardware()
        return self._hardware

    @property
    def device_type(self) -> str:
        wanted = self.settings.device
        if wanted == "cuda" and not self.hardware.gpus:
            raise pytest.UsageError(
                "pytest-dlperf: --dlperf-device=cuda, but no NVIDIA GPU was found through NVML "
                "(pynvml); use --dlperf-device=cpu or run on a GPU host")
        return self.hardware.device_type if wanted == "auto" else wanted

    @property
    def devices_per_node(self) -> int:
        hw, wanted = self.hardware, self.settings.devices_per_node
        launched = getattr(self.launcher, "dist", None)
        if launched is not None:  # external: the job was started with its own shape
            return int(launched.local_world_size)
        if self.device_type == "cuda":
            have, what = len(hw.gpus), "NVIDIA GPUs"
        else:  # one core at least per simulated device, or DDP oversubscribes the CPU
            have, what = hw.cpu_count, "usable CPU cores (one per simulated device)"
        allocation = getattr(self.launcher, "allocation", None)
        if self.device_type == "cuda" and allocation is not None and allocation.gpus_per_node:
            have, what = allocation.gpus_per_node, "GPUs per node in the Slurm allocation"
        if wanted is None:
            return have if self.device_type == "cuda" else min(2, have)
        if wanted > have:
            raise pytest.UsageError(
                f"pytest-dlperf: --devices-per-node={wanted}, but this host has {have} {what}; "
                f"pass --devices-per-node {have} or less")
        return wanted

    def ladder(self, multinode: bool) -> list[Topology]:
        """DLPerf's ladder: 1 device, then a full node; multinode cases add 2, 4, ... nodes."""
        per_node = self.devices_per_node
        max_nodes = getattr(self.launcher, "nodes", self.settings.nodes)
        shapes = {(1, 1), (1, per_node)}
        if multinode:
            n = 2
            while n < max_nodes:
                shapes.add((n, per_node))
                n *= 2
            shapes.add((max_nodes, per_node))
        return [make_topology(self.hardware, n, d, self.device_type,
                              all_nodes_here=self.launcher.all_nodes_here)
                for n, d in sorted(shapes)]

    def check_nodes(self) -> None:
        allocation = getattr(self.launcher, "allocation", None)
        if allocation is not None and self.settings.nodes > allocation.nodes:
            raise pytest.UsageError(
                f"pytest-dlperf: --nodes={self.settings.nodes}, but Slurm allocation "
                f"{allocation.job_id} has {allocation.nodes} node(s) ({allocation.nodelist}); "
                f"pass --nodes {allocation.nodes} or less, or allocate more nodes")

    @property
    def is_reporter(self) -> bool:
        """Only rank 0 of an externally launched job writes results and tables."""
        return bool(getattr(self._launcher, "is_reporter", True))

    @property
    def work_root(self) -> Path:
        """Per-session scratch for the cases' specs and results. Remote nodes must see it,
        so outside local mode it lives under the rootdir, not in this host's /tmp."""
        if self._work_root is None:
            parent = None
            if not self.launcher.all_nodes_here:
                parent = self.rootpath / ".pytest-dlperf"
                parent.mkdir(exist_ok=True)
            self._work_root = Path(tempfile.mkdtemp(prefix="pytest-dlperf-", dir=parent))
        return self._work_root

    def close(self) -> None:
        if self._work_root is not None:
            shutil.rmtree(self._work_root, ignore_errors=True)


STATE = pytest.StashKey[SessionState]()


def pytest_addoption(parser: pytest.Parser) -> None:
    settings_mod.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "multinode: a scaling case; runs on 1, 2, 4, ... nodes up to --nodes")
    config.addinivalue_line(
        "markers", "dlperf(tolerance=None): per-test options of pytest-dlperf; tolerance "
        "overrides the baseline's and the run's (a fraction, 0.03 = 3%)")
    settings = settings_mod.resolve(config)
    config.stash[STATE] = SessionState(settings, BaselineStore(settings.baselines), config.rootpath)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Check explicit device requests against the host before collecting anything; with the
    defaults nothing can be wrong, and detection waits until a case needs it."""
    state = session.config.stash[STATE]
    state.check_nodes()
    if state.settings.devices_per_node is not None or state.settings.device != "auto":
        state.devices_per_node  # noqa: B018 - raises pytest.UsageError naming the flag


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Scaling cases run when asked for (``-m multinode``) or when there are nodes to scale to
    (``--nodes`` > 1); otherwise they would repeat the single-node cases' 1n1d and 1nMd."""
    if config.stash[STATE].settings.nodes > 1 or "multinode" in (config.option.markexpr or ""):
        return
    scaling = [item for item in items if item.get_closest_marker("multinode") is not None]
    if scaling:
        config.hook.pytest_deselected(items=scaling)
        items[:] = [item for item in items if item.get_closest_marker("multinode") is None]


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        state.close()
        del config.stash[STATE]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Axes appear where a test names them: ``cluster`` sweeps the topology ladder and ``amp``
    sweeps fp32/AMP. A test that only asks for ``throughput_meter`` runs one full-node fp32 case."""
    named = inspect.signature(metafunc.function).parameters
    state = metafunc.config.stash[STATE]
    if "cluster" in named:
        multinode = metafunc.definition.get_closest_marker("multinode") is not None
        topologies = state.ladder(multinode)
        metafunc.parametrize("cluster", topologies, ids=[t.id for t in topologies], indirect=True)
    if "amp" in named:
        metafunc.parametrize("amp", PRECISIONS, indirect=True)


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Cluster:
    """The topology of this case (nodes, devices per node, device type, backend) and
    ``run(spec)``, which runs the worker on every rank and returns their JSON results."""
    state = request.config.stash[STATE]
    topology = getattr(request, "param", None) or state.ladder(multinode=False)[-1]
    gpus = len(state.hardware.gpus)
    if (state.launcher.all_nodes_here and topology.device_type == "cuda"
            and topology.world_size > gpus):
        pytest.skip(f"{topology.id} needs {topology.world_size} GPUs and local mode runs every "
                    f"node on this host, which has {gpus}; lower --devices-per-node or run it "
                    "on a cluster")
    can_run = getattr(state.launcher, "can_run", None)
    if can_run is not None and not can_run(topology):
        nodes = getattr(state.launcher, "nodes", "?")
        pytest.skip(f"{topology.id}: pytest was launched as a {nodes}-node job with its own "
                    "ranks; external mode runs only that topology")
    return Cluster(topology, state.launcher, state.work_root, state.settings.timeout)


@pytest.fixture
def amp(request: pytest.FixtureRequest) -> Precision:
    """The precision of this case: fp32, or AMP (fp16 + loss scaling on CUDA, bf16 on CPU)."""
    state = request.config.stash[STATE]
    return Precision(getattr(request, "param", "fp32"), state.device_type)


@pytest.fixture
def throughput_meter(request: pytest.FixtureRequest, cluster: Cluster,
                     amp: Precision) -> ThroughputMeter:
    """Runs a workload on ``cluster`` under the protocol and judges it against its baseline."""
    return ThroughputMeter(request.node, cluster, amp, request.config.stash[STATE])


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
            isolation=getattr(self.cluster.launcher, "isolation", None))
        reference = (self._reference_median(framework, version, env, workload)
                     if self.cluster.world_size > 1 else None)
        if reference is not None:
            report.speedup = result.median / reference
            report.efficiency = report.speedup / self.cluster.world_size
            if baseline is not None and baseline.efficiency is not None:
                report.efficiency_verdict = compare(report.efficiency, baseline.efficiency,
                                                    tolerance)
        if getattr(self.cluster.launcher, "is_reporter", True):
            report.baseline_action = self._maybe_update(report, baseline)
            self.state.reports.append(report)
        self._conclude(report)
        return report

    def _conclude(self, report: CaseReport) -> None:
        """Judge the case; in external mode only rank 0 judges and the others take its word."""
        launcher = self.cluster.launcher
        share = getattr(launcher, "share_outcome", None)
        if share is None:
            self._judge(report)
            return
        timeout = self.state.settings.timeout
        if not launcher.is_reporter:  # type: ignore[attr-defined]
            outcome = share({}, timeout)
            if outcome["status"] == "failed":
                pytest.fail(f"pytest-dlperf (rank 0's verdict): {outcome['message']}",
                            pytrace=False)
            return
        try:
            self._judge(report)
        except pytest.fail.Exception as exc:
            share({"status": "failed", "message": str(exc.msg)}, timeout)
            raise
        share({"status": "passed", "message": ""}, timeout)

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
        can_run = getattr(self.cluster.launcher, "can_run", lambda _: True)
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
        if not can_run(topology):
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
                return settings_mod.parse_fraction(marker.kwargs["tolerance"])
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


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is not None and state.settings.json is not None and state.is_reporter:
        write_json_atomic(state.settings.json, results_json(state.reports))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None or not state.reports:
        return
    proto = state.settings.protocol
    terminalreporter.write_sep(
        "-", f"pytest-dlperf: training throughput ({proto.name} protocol: {proto.warmup_steps} "
        f"warm-up, {proto.steps} timed steps x {proto.repeats} repeats, median)")
    for line in text_table(rows([r.benchmark_entry() for r in state.reports])):
        terminalreporter.write_line(line)
    if state.settings.json is not None:
        terminalreporter.write_line(f"results written to {state.settings.json}")
