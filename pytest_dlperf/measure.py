"""One case end to end, on the pytest side: size the workload, check it can run here, launch it on
the cluster, aggregate the ranks, fingerprint, read the baseline, and apply what ``decide`` says
(extra repeats, recording, failing or warning). The ``throughput_meter`` fixture hands a test a
``ThroughputMeter``."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Mapping, NoReturn

import pytest

from . import decide, frameworks
from . import flops as flops_mod
from .baselines import (EFFICIENCY, MEMORY, THROUGHPUT, Baseline, BaselineError, Change, Metric,
                        Run)
from .launch import Cluster, LaunchError, Watch
from .models import builtin
from .batchsearch import BatchSearchError, Probe, Search, search
from .protocol import Protocol, Result, aggregate, launch_size, split
from .report import CaseReport
from .session import SessionState
from .settings import parse_marker
from .spec import RankSpec, spec_for
from .stats import Verdict, coefficient_of_variation
from .topology import Topology, fingerprint, make_topology, python_minor
from .flops import FlopsCount
from .workload import (CaseWorkload, Precision, RecipeReference, SizeValue, Workload,
                       WorkloadError, recipe_reference)


# Steps a batch-size probe trains: enough for the optimizer's state and the allocators'
# high-water mark (the first step allocates the most), not a measurement.
PROBE_STEPS = 3
# Fingerprint fields that do not bear on how much memory a batch takes: an earlier search's
# answer is a good start whatever they are.
_NOT_MEMORY = ("framework_version", "python", "accelerator_stack", "protocol", "batch_size")


class _OutOfMemoryAtTheEdge(Exception):
    """A measurement at a batch the search found ran out of memory."""

    def __init__(self, seconds: float, message: str) -> None:
        super().__init__(message)
        self.seconds, self.message = seconds, message


def _first_line(exc: LaunchError) -> str:
    """The first line of the first rank's error (an out-of-memory one says the batch)."""
    first = next(iter(exc.rank_errors.values()), exc.summary)
    return first.strip().splitlines()[0][:300]


class DLPerfWarning(pytest.PytestWarning):
    """A case passed but something about its figures deserves a look."""


def fail(message: str) -> NoReturn:
    """Fail the test with ``message`` alone: no traceback, and not the error being handled
    (which the message already says) printed again above it."""
    try:
        pytest.fail(message, pytrace=False)
    except pytest.fail.Exception as failed:
        raise failed from None


class ThroughputMeter:
    def __init__(self, node: pytest.Item, cluster: Cluster, amp: Precision,
                 state: SessionState) -> None:
        self.node, self.cluster, self.amp, self.state = node, cluster, amp, state
        self.protocol = state.settings.protocol
        self._rank_flops: dict[str, Any] | None = None  # what a torch rank counted
        self._batch_search: Search | None = None  # --dlperf-batch-size max

    @property
    def case(self) -> str:
        """The baseline key: the test's node id, relative to the rootdir."""
        return self.node.nodeid

    @property
    def compiler(self) -> str:
        return str(getattr(self.node, "funcargs", {}).get("compiler", "eager"))

    def _fail(self, message: str) -> NoReturn:
        fail(f"pytest-dlperf: {self.node.nodeid}: {message}")

    def measure(self, framework: str, workload: Workload | str = "resnet50", *,
                batch_size: int | None = None,
                sizes: Mapping[str, SizeValue] | None = None) -> CaseReport:
        """Train ``workload`` (a ``Workload``, or a built-in model's name) with ``framework`` on
        every rank, apply the protocol, compare the median (and a multi-device case's scaling
        efficiency) with the baseline, failing this test on a regression, and return the
        record. ``batch_size`` (per device) and ``sizes`` override the workload's for this
        call; ``--dlperf-batch-size`` overrides both."""
        try:
            chosen = (builtin(workload, framework, frameworks.recipe_key(framework))
                      if isinstance(workload, str) else workload)
            recipe = frameworks.recipe_for(framework, chosen)
            batch = self.state.settings.batch_size or batch_size
            searching = batch == "max"
            sized = CaseWorkload.of(chosen, self.cluster.device_type, self.amp.name,
                                    None if isinstance(batch, str) else batch, sizes)
        except (LookupError, WorkloadError) as exc:
            self._fail(str(exc))
        version = self._framework_version(framework)
        self._check_amp(framework)
        self._check_compiler(framework)
        self._batch_search = None
        if searching:
            self._batch_search = self._search_batch(framework, version, chosen, sized, recipe)
            sized = replace(sized, batch_size=self._batch_search.found)
        policy = self._policy(None)
        while True:
            spec = self._spec(framework, chosen, sized, recipe)
            flops_key = self._flops_key(chosen, sized)
            counted = self.state.flops_counts.get(flops_key)
            if (counted is None and chosen.flops_per_sample is None
                    and frameworks.recipe_key(framework) == "torch"
                    and not self.state.settings.memory_limit):
                # Rank 0 of the first launch counts. Not under a memory limit: counting builds
                # the model once more (BERT's on the CPU), memory the probes of a batch search
                # did not use; a subprocess counts then, as for the other frameworks.
                spec = replace(spec, count_flops=True)
            launched_at = time.time()
            self._rank_flops = None
            try:
                result, env = self._launches(spec, [policy.windows_per_launch] * policy.launches,
                                             at_the_edge=self._batch_search is not None)
                break
            except _OutOfMemoryAtTheEdge as edge:
                assert self._batch_search is not None
                try:
                    found = self._batch_search.retreat(edge.seconds, edge.message)
                except BatchSearchError as exc:
                    self._fail(f"--dlperf-batch-size max: {exc}")
                sized = replace(sized, batch_size=found)
        spec = replace(spec, count_flops=False)
        flops = self._flops(chosen, sized, flops_key)
        fp = self._fingerprint(self.cluster.topology, framework, version, env, sized)
        baseline = self._load_baseline(fp)
        policy = self._policy(baseline)
        reference = (self._reference_median(spec, version, env, sized)
                     if self.cluster.world_size > 1 else None)
        devices = self.cluster.world_size

        def judge(result: Result) -> tuple[Verdict, Verdict | None, Verdict | None]:
            verdict, efficiency = decide.verdicts(
                result.samples_per_s, result.windows_per_launch, baseline, reference, devices,
                policy.tolerance, policy)
            memory = decide.memory_verdict(result.memory_launches, baseline,
                                           policy.memory_tolerance, policy)
            return verdict, efficiency, memory

        verdict, efficiency, memory = judge(result)
        while more := decide.more_launches(verdict, efficiency, len(result.window_s), policy,
                                           memory):
            result = result.extended(
                self._launches(spec, more, extra=len(result.windows_per_launch))[0])
            verdict, efficiency, memory = judge(result)
        callspec = getattr(self.node, "callspec", None)
        report = CaseReport(
            case=self.case, name=self.node.name, nodeid=self.node.nodeid,
            params=_params_json(callspec), param=callspec.id if callspec else "",
            framework=framework,
            framework_version=str(env.get("framework_version", version)),
            topology=self.cluster.topology, precision=self.amp, workload=sized,
            protocol=self.protocol, result=result, fingerprint=fp, environment=env,
            verdict=verdict, efficiency_verdict=efficiency, memory_verdict=memory,
            baseline_path=self._display(self.state.store.path_for(self.case, fp)),
            launched_at=launched_at, launcher=self.cluster.launcher.name,
            isolation=self.cluster.launcher.isolation,
            cv=coefficient_of_variation(result.samples_per_s), compiler=self.compiler,
            batch_search=self._batch_search,
            machine=self.state.settings.machine)
        if baseline is None:
            others, unnamed = self.state.store.elsewhere(
                self.case, [c for c, _ in self._aliases(self.case, fp)])
            report.other_machines = [m for m in others if m != self.state.settings.machine]
            report.unnamed_baselines = self._display(unnamed) if unnamed else None
        self._utilization(report, flops)
        if reference is not None:
            report.reference = reference
            report.speedup = result.median / reference
            report.efficiency = report.speedup / devices
        if self.cluster.launcher.is_reporter:
            if decide.records(policy, baseline is not None):
                report.baseline_change = self._record(report, policy)
            unread = self.state.judge_history(report)
            if unread is not None:
                self.node.warn(DLPerfWarning(unread))
            self.state.reports.append(report)
        self._conclude(report, policy)
        return report

    # -- before launch: can this case run here? ------------------------------------------

    def _check_compiler(self, framework: str) -> None:
        if self.compiler == "eager":
            return
        if self.protocol.warmup_steps < 1:
            self._fail("a compiled case needs at least one warm-up step (compilation happens "
                       "in the first step, which is never timed); raise --dlperf-warmup-steps")
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

    def _framework_version(self, framework: str) -> str:
        python = self.cluster.pythons.get(framework)
        try:
            version = frameworks.installed_version(framework, python)
        except (LookupError, RuntimeError) as exc:
            where = f" (--dlperf-python {framework}={python})" if python else ""
            self._fail(f"{exc}{where}")
        if version is None and python:
            self._fail(f"{framework} is not installed in its worker interpreter {python} "
                       f"(--dlperf-python); {frameworks.install_hint(framework)}")
        if version is None:
            pytest.skip(f"{framework} is not installed in pytest's interpreter and no "
                        f"--dlperf-python {framework}=PATH is given; "
                        f"{frameworks.install_hint(framework)}")
        return version

    # -- launching -----------------------------------------------------------------------

    def _spec(self, framework: str, workload: Workload, sized: CaseWorkload,
              recipe: RecipeReference | None) -> RankSpec:
        """The one record every rank gets (the cluster adds where it runs)."""
        return spec_for(framework, workload, protocol=self.protocol,
                        device_type=self.cluster.device_type, precision=self.amp.name,
                        compiler=self.compiler, world_size=self.cluster.world_size,
                        batch_size=sized.batch_size, sizes=dict(sized.sizes), recipe=recipe
                        ).with_(memory_limit=self.state.settings.memory_limit)

    def _launches(self, spec: RankSpec, windows: list[int], *, at_the_edge: bool = False,
                  extra: int = 0) -> tuple[Result, dict[str, Any]]:
        """One launch of the case per entry of ``windows``, each timing that many windows.
        ``at_the_edge``: the batch is one a search found; running out of memory raises
        ``_OutOfMemoryAtTheEdge`` (the caller steps down) instead of failing the case.
        ``extra``: these launches come after that many, for an inconclusive verdict."""
        result: Result | None = None
        env: dict[str, Any] = {}
        for index, count in enumerate(windows):
            launched = replace(spec, protocol=replace(spec.protocol, repeats=count),
                               count_flops=spec.count_flops and index == 0)
            label = (f"extra launch {index + 1}/{len(windows)} (inconclusive after {extra})"
                     if extra else f"launch {index + 1}/{len(windows)}")
            one, env = self._run(self.cluster, launched, at_the_edge=at_the_edge, label=label)
            result = one if result is None else result.extended(one)
        assert result is not None, "at least one launch"
        return result, env

    def _watch(self, label: str) -> Watch | None:
        """Live progress of one launch (``progress.LiveLine``), labelled with this case; None
        where nothing is shown (-q): the ranks then write no progress at all."""
        live = self.state.live
        if live is None or live.mode is None:
            return None
        return lambda path: live.watch(path, self.node.name, label)

    def _run(self, cluster: Cluster, spec: RankSpec, *, at_the_edge: bool = False,
             label: str = "launch") -> tuple[Result, dict[str, Any]]:
        started = time.perf_counter()
        try:
            ranks = cluster.run(spec, self._watch(label))
        except LaunchError as exc:
            if at_the_edge and exc.kind == "out_of_memory":
                raise _OutOfMemoryAtTheEdge(time.perf_counter() - started,
                                            _first_line(exc)) from exc
            fail(f"pytest-dlperf: {self.case} {exc.kind.replace('_', ' ')} on "
                 f"{cluster.topology.id}: {exc}")
        env = dict(ranks[0]["environment"])
        if spec.count_flops:
            self._rank_flops = ranks[0].get("flops")
        hardware = self.state.hardware
        if cluster.device_type == "cuda":  # what NVML says, beside what the framework saw
            env.update(driver=hardware.gpu_driver, gpu_memory_bytes=list(hardware.gpu_memory))
        return aggregate(ranks, spec.batch_size, time.perf_counter() - started), env

    # -- --dlperf-batch-size max ------------------------------------------------------------

    def _search_batch(self, framework: str, version: str, workload: Workload,
                      sized: CaseWorkload, recipe: RecipeReference | None) -> Search:
        """The largest per-device batch that trains a few steps here, each probe a fresh
        launch; from the batch an earlier run found (its baseline's record), else from the
        workload's own."""
        match = {k: v for k, v in self._fingerprint(self.cluster.topology, framework, version,
                                                    {}, sized).items()
                 if k not in _NOT_MEMORY}
        seed = self.state.store.found_batch(self.case, match)
        probe_protocol = Protocol(warmup_steps=PROBE_STEPS - 1, steps=1, repeats=1,
                                  name="probe")

        def fits(batch: int) -> Probe:
            spec = self._spec(framework, workload, replace(sized, batch_size=batch), recipe)
            spec = replace(spec, protocol=probe_protocol)
            started = time.perf_counter()
            try:
                self.cluster.run(spec, self._watch(f"batch-size probe {batch}"))
            except LaunchError as exc:
                seconds = time.perf_counter() - started
                if exc.kind != "out_of_memory":
                    fail(f"pytest-dlperf: {self.case}: the batch-size search's probe at batch "
                         f"{batch} failed, and not for lack of memory, on "
                         f"{self.cluster.topology.id}: {exc}")
                return Probe(batch, False, seconds, _first_line(exc))
            return Probe(batch, True, time.perf_counter() - started)

        try:
            return search(fits, seed or sized.batch_size, seeded=seed is not None)
        except BatchSearchError as exc:
            fail(f"pytest-dlperf: {self.case}: --dlperf-batch-size max: {exc} (on "
                 f"{self.cluster.topology.id}; --dlperf-memory-limit "
                 f"{self.state.settings.memory_limit or 'none'})")

    # -- FLOPs ---------------------------------------------------------------------------

    def _flops_key(self, workload: Workload, sized: CaseWorkload) -> str:
        import json

        torch_recipe = workload.recipes.get("torch")
        reference = (None if torch_recipe is None else
                     recipe_reference(torch_recipe, f"workload {workload.name!r}, torch recipe"))
        return json.dumps([workload.name, workload.flops_per_sample,
                           None if reference is None else asdict(reference),
                           dict(sized.sizes), sized.batch_size, self.cluster.device_type],
                          sort_keys=True, default=str)

    def _flops(self, workload: Workload, sized: CaseWorkload, key: str) -> FlopsCount:
        """FLOPs per sample: the workload's own figure, else counted once per session (by a
        torch rank, else in a subprocess with the torch recipe; pytest_dlperf.flops)."""
        counts = self.state.flops_counts
        if key in counts:
            return counts[key]
        if workload.flops_per_sample is not None:
            count = FlopsCount(float(workload.flops_per_sample), "workload")
        elif self._rank_flops is not None:
            data = self._rank_flops
            value = data.get("flops_per_sample")
            count = FlopsCount(None if value is None else float(value), str(data["source"]),
                               data.get("problem") or data.get("meta_error"))
        else:
            try:
                reference = spec_for("torch", workload, protocol=self.protocol,
                                     device_type=self.cluster.device_type,
                                     batch_size=sized.batch_size, sizes=dict(sized.sizes),
                                     recipe_key="torch")
            except WorkloadError as exc:
                count = FlopsCount(None, "none", str(exc))
            else:
                count = flops_mod.count_in_subprocess(reference, self.state.work_root)
        counts[key] = count
        return count

    def _utilization(self, report: CaseReport, flops: FlopsCount) -> None:
        """Achieved FLOP/s per device and, where the device's peak is known, MFU."""
        report.flops = flops
        if flops.per_sample is None:
            return
        per_device = report.result.median / report.topology.world_size
        report.achieved_flops_per_s = flops.per_sample * per_device
        precision = flops_mod.math_precision(self.amp.dtype, report.environment)
        gpus = self.state.hardware.gpus
        device = gpus[0] if self.cluster.device_type == "cuda" and gpus else None
        peak = flops_mod.peak_for(device, precision, self.state.settings.peak_flops)
        if peak is not None:
            report.peak = peak
            report.mfu = report.achieved_flops_per_s / peak.flops_per_s

    # -- baselines -----------------------------------------------------------------------

    def _fingerprint(self, topology: Topology, framework: str, version: str, env: dict[str, Any],
                     sized: CaseWorkload) -> dict[str, Any]:
        return fingerprint(topology, framework=framework,
                           framework_version=str(env.get("framework_version", version)),
                           precision=self.amp.name, model=sized.model,
                           batch_size="max" if self._batch_search is not None
                           else sized.batch_size, sizes=sized.sizes,
                           protocol_slug=self.protocol.slug,
                           python=python_minor(env.get("python")),
                           accelerator_stack=self._accelerator_stack(topology, env),
                           compiler=self.compiler, machine=self.state.settings.machine)

    def _aliases(self, case: str, fp: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """Where older versions filed this case's baseline: under the test file's basename
        (before cases were keyed by rootdir-relative path), with pytest's Python in the
        fingerprint (before it was the ranks')."""
        name = case.partition("::")[2]
        cases = [case, f"{self.node.path.name}::{name}"]
        fps = [fp]
        pytest_python = python_minor(None)
        if fp.get("python") != pytest_python:
            fps.append({**fp, "python": pytest_python})
        return [(c, f) for c in cases for f in fps][1:]

    def _load_baseline(self, fp: dict[str, Any]) -> Baseline | None:
        try:
            return self.state.store.load(self.case, fp, self._aliases(self.case, fp))
        except BaselineError as exc:
            if self.state.settings.update_baselines == "all":
                return None  # replaced below; the unreadable file is kept as .bak
            fail(f"pytest-dlperf: {exc}")

    def _reference_median(self, spec: RankSpec, version: str, env: dict[str, Any],
                          sized: CaseWorkload) -> float | None:
        """The 1n1d median for this test and precision, with the same per-device batch: from
        this session, else from its baseline, else measured now (and not reported); None when
        the launcher cannot run 1n1d (external mode) and nothing else has it."""
        topology = make_topology(self.state.hardware, 1, 1, self.cluster.device_type)
        fp = self._fingerprint(topology, spec.framework, version, env, sized)
        case = self.state.case_at(self.node, topology)
        for report in self.state.reports:
            if report.case == case and report.fingerprint == fp:
                return report.result.median
        try:
            baseline = self.state.store.load(case, fp, self._aliases(case, fp)) if case else None
        except BaselineError:
            baseline = None
        if baseline is not None:
            return baseline.throughput.median
        if not self.cluster.launcher.can_run(topology):
            return None
        single = replace(spec, optimizer=spec.optimizer.for_batch_ratio(
            1 / self.cluster.world_size))
        return self._run(self.cluster.at(topology), single, label="1n1d reference")[0].median

    def _accelerator_stack(self, topology: Topology, env: dict[str, Any]) -> str | None:
        if topology.device_type != "cuda":
            return None
        return (f"cuda{env.get('cuda')}-cudnn{env.get('cudnn')}-nccl{env.get('nccl')}"
                f"-driver{self.state.hardware.gpu_driver}")

    def _policy(self, baseline: Baseline | None) -> decide.Policy:
        settings = self.state.settings
        marker = self.node.get_closest_marker("dlperf")
        keywords = parse_marker(marker, self.node.nodeid) if marker else {}
        tolerance = keywords.get("tolerance")
        if tolerance is None:
            tolerance = (baseline.tolerance if baseline is not None
                         and baseline.tolerance is not None else settings.tolerance)
        launches = settings.launches if self.cluster.launcher.can_add_repeats else 1
        per_launch = launch_size(self.protocol.repeats, launches)
        return decide.Policy(
            tolerance=float(tolerance), repeats=per_launch * launches,
            max_repeats=max(settings.max_repeats, per_launch * launches),
            can_add_repeats=self.cluster.launcher.can_add_repeats,
            update=settings.update_baselines, strict=settings.strict,
            unstable_cv=settings.unstable_cv, launches=launches,
            keep_launches=settings.baseline_launches,
            memory_tolerance=float(keywords.get("memory_tolerance", settings.memory_tolerance)),
            min_mfu=keywords.get("min_mfu"),
            straggler_threshold=settings.straggler_threshold)

    def _record(self, report: CaseReport, policy: decide.Policy) -> Change | None:
        result = report.result
        metrics = report_metrics(report)
        recorded = _recorded(report)
        run = Run(recorded["datetime"], recorded["commit"], recorded["dirty"],
                  len(result.windows_per_launch))
        try:
            return self.state.store.update(
                Baseline(case=self.case, fingerprint=report.fingerprint, metrics=metrics,
                         recorded=recorded, runs=[run]),
                only_missing=policy.update == "missing",
                keep=policy.keep_launches if policy.update == "add" else None,
                aliases=self._aliases(self.case, report.fingerprint))
        except BaselineError as exc:
            fail(f"pytest-dlperf: {exc}")

    # -- the outcome -----------------------------------------------------------------------

    def _conclude(self, report: CaseReport, policy: decide.Policy) -> None:
        """Judge the case; in external mode only rank 0 judges and the others take its word."""
        launcher, timeout = self.cluster.launcher, self.state.settings.timeout
        if not launcher.is_reporter:
            outcome = launcher.share_outcome({}, timeout)
            if outcome["status"] == "failed":
                pytest.fail(f"pytest-dlperf (rank 0's verdict): {outcome['message']}",
                            pytrace=False)
            return
        decision = decide.decide(report, policy)
        for warning in decision.warnings:
            self.node.warn(DLPerfWarning(warning))
        if decision.failure is not None:
            launcher.share_outcome({"status": "failed", "message": decision.failure}, timeout)
            pytest.fail(decision.failure, pytrace=False)
        launcher.share_outcome({"status": "passed", "message": ""}, timeout)

    def _display(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.state.rootpath))
        except ValueError:
            return str(path)


def _params_json(callspec: Any) -> dict[str, Any]:
    """The test's parameters as JSON: a topology by its id, other objects by ``repr``."""
    if callspec is None:
        return {}
    out: dict[str, Any] = {}
    for name, value in callspec.params.items():
        if isinstance(value, Topology):
            value = value.id
        elif not isinstance(value, (str, int, float, bool, type(None))):
            value = repr(value)
        out[name] = value
    return out


def report_metrics(report: CaseReport) -> dict[str, Metric]:
    """A case's figures as the baseline (and the history) keep them: every window's, by launch.
    Throughput always; scaling efficiency of a multi-device case with its 1n1d reference; peak
    memory where the ranks measured it."""
    result = report.result
    metrics = {THROUGHPUT: Metric(result.launches, result.median, True,
                                  f"{report.workload.unit}/s")}
    if report.efficiency is not None and report.reference is not None:
        samples = decide.efficiencies(result.samples_per_s, report.reference,
                                      report.topology.world_size)
        metrics[EFFICIENCY] = Metric(split(samples, result.windows_per_launch),
                                     report.efficiency, True, "fraction")
    if result.memory_bytes:
        launches = result.memory_launches
        metrics[MEMORY] = Metric(launches, _median_of_launches(launches), False, "bytes")
    return metrics


def _median_of_launches(launches: list[list[float]]) -> float:
    import statistics

    return float(statistics.median(statistics.median(launch) for launch in launches))


def _recorded(report: CaseReport) -> dict[str, Any]:
    from pytest_benchmark.utils import get_commit_info

    commit = get_commit_info()
    search = {"batch_search": report.batch_search.to_json()} if report.batch_search else {}
    return {
        **search,
        "datetime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit.get("id"),
        "dirty": commit.get("dirty"),
        "environment": report.environment,
        "protocol": report.protocol.to_json(),
    }
