"""pytest wiring for pytest-dlperf: options, markers, fixtures, parametrization and reports.

Everything this module calls lives in a module named after its concept; nothing here imports a
deep-learning framework, so ``pytest --help`` stays cheap.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import pytest

from ..core.jsonio import write_json_atomic
from ..core.parallel import Layout
from ..core.workload import PRECISIONS, Precision
from ..launch import BUILTIN_LAUNCHERS, Cluster, Launcher, detect, hook_modules, make_builtin
from ..report.results import benchmark_entry, change_lines, results_json
from ..report.tables import (
    AB_HEADER,
    BUSY_HEADER,
    ab_code_lines,
    ab_rows,
    busy_rows,
    frameworks_side_by_side,
    pivot_rows,
    rows,
    table_notes,
    text_table,
)
from ..store.baselines import BaselineStore
from ..verdict.busy import MACHINE_BUSY, summary_line
from . import hooks, layouts, optin, options
from . import settings as settings_mod
from . import sweep as sweeps
from .live import LiveLine
from .meter import ThroughputMeter
from .outcome import NOT_JUDGED, DLPerfWarning
from .session import LauncherHooks, SessionState

__all__ = ["DLPerfWarning", "STATE", "ThroughputMeter"]


STATE = pytest.StashKey[SessionState]()
# -m multinode on perf cases none of which has the marker: their count, then the summary's hint.
UNMARKED_PERF_CASES = pytest.StashKey[int]()
MULTINODE_HINT = pytest.StashKey[str]()
# Layouts that cannot be read or fit none of a test's topologies, found while parametrizing.
LAYOUT_ERRORS = pytest.StashKey[list[str]]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)
    for module in hook_modules():  # the built-in launchers' own options and makers (Ray's)
        pluginmanager.register(module, module.__name__)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


@pytest.hookimpl(trylast=True)
def pytest_dlperf_commit_info(config: pytest.Config) -> dict[str, Any]:
    """The plugin's own answer to its hook: git's commit, branch and dirty flag."""
    from pytest_benchmark.utils import get_commit_info

    return dict(get_commit_info())


@pytest.hookimpl(trylast=True)
def pytest_dlperf_launcher_names(config: pytest.Config) -> list[str]:
    """The plugin's own launchers' names."""
    return list(BUILTIN_LAUNCHERS)


@pytest.hookimpl(trylast=True)
def pytest_dlperf_detect_launcher(config: pytest.Config, environ: dict[str, str]) -> str:
    """What ``auto`` picks when no other implementation claims the environment."""
    return detect(environ)


@pytest.hookimpl(trylast=True)
def pytest_dlperf_make_launcher(config: pytest.Config, name: str,
                                environ: dict[str, str]) -> Launcher | None:
    """The plugin's own launchers (None for another name: not one of ours)."""
    return make_builtin(name, environ)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "multinode: a scaling case; runs on 1, 2, 4, ... nodes up to --nodes")
    config.addinivalue_line(
        "markers", "dlperf(tolerance=None, memory_tolerance=None, min_mfu=None): per-test "
        "options of pytest-dlperf; tolerance and memory_tolerance override the baseline's and "
        "the run's (fractions, 0.03 = 3%); min_mfu fails a case whose MFU is below it")
    config.addinivalue_line(
        "markers", "layouts(*layouts): the layouts a test that takes the `layout` fixture runs "
        "under (dp, fsdp, tp, pp, fsdp2xtp2, ...; docs/layouts.md); --dlperf-layouts "
        "overrides it")
    config.addinivalue_line(
        "markers", "sweep(**{size: ladder}): the rungs of a size of its workload a test that "
        "takes the `sweep` fixture runs a case at each of (vocab=\"200k..3.2M:x2\"; "
        "docs/sweeps.md); --dlperf-sweep overrides them")
    settings = settings_mod.resolve(config)
    config.stash[NOT_JUDGED] = []
    store = BaselineStore(settings.baselines, settings.protocol.repeats)
    config.stash[STATE] = SessionState(
        settings, store, config.rootpath,
        commit_info=lambda: config.hook.pytest_dlperf_commit_info(config=config),
        launchers=LauncherHooks.of(config, settings_mod.source_of(config, "launcher")))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Launcher, hardware, device type and devices per node are settled here, before anything
    is collected: a request the host cannot meet is a usage error naming the flag."""
    state = session.config.stash[STATE]
    state.start(dict(os.environ))
    if not _under_xdist(session.config):
        state.open_history(settings_mod.source_of(session.config, "history"))
        if state.is_reporter:
            state.live = LiveLine(session.config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Bad ``dlperf`` markers are usage errors before anything runs. Every case is indexed by
    topology before ``-k``/``-m`` deselect any (a scaling case's 1n1d reference). Scaling cases
    run when asked for (``-m multinode``) or when there are nodes to scale to (``--nodes`` > 1);
    otherwise they would repeat the single-node cases' 1n1d and 1nMd."""
    errors = config.stash.get(LAYOUT_ERRORS, [])
    if errors:
        raise pytest.UsageError("\n".join(dict.fromkeys(errors)))
    for item in items:
        for marker in item.iter_markers("dlperf"):
            options.parse_marker(marker, item.nodeid)
    sweeps.unswept(items, config.stash[STATE].settings.sweep)
    config.stash[STATE].index_siblings(items)
    asks_multinode = "multinode" in (config.option.markexpr or "")
    perf = [item for item in items if _is_perf_case(item)]
    if asks_multinode and perf and not any(i.get_closest_marker("multinode") for i in perf):
        config.stash[UNMARKED_PERF_CASES] = len(perf)
    if config.stash[STATE].settings.nodes > 1 or asks_multinode:
        return
    scaling = [item for item in items if item.get_closest_marker("multinode") is not None]
    if scaling:
        config.hook.pytest_deselected(items=scaling)
        items[:] = [item for item in items if item.get_closest_marker("multinode") is None]


def pytest_collection_finish(session: pytest.Session) -> None:
    """``-m multinode`` selects cases by the marker alone: on perf cases without it, it
    deselects every one and pytest exits 5 with no word of why."""
    unmarked = session.config.stash.get(UNMARKED_PERF_CASES, 0)
    if unmarked and not any(_is_perf_case(item) for item in session.items):
        session.config.stash[MULTINODE_HINT] = (
            f"pytest-dlperf: -m multinode deselected every perf case ({unmarked}): no perf "
            "case has the multinode marker; mark scaling tests with @pytest.mark.multinode "
            "(they run on 1, 2, 4, ... nodes up to --nodes), or leave -m multinode out to run "
            "the single-node cases")


def _is_perf_case(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "cluster" in names or "throughput_meter" in names


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        state.close()
        del config.stash[STATE]
    if NOT_JUDGED in config.stash:
        del config.stash[NOT_JUDGED]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Axes appear where a test names them: ``cluster`` sweeps the topology ladder and ``amp``
    sweeps fp32/AMP. A test that only asks for ``throughput_meter`` runs one full-node fp32 case."""
    named = inspect.signature(metafunc.function).parameters
    state = metafunc.config.stash[STATE]
    spellings, pairs = None, None
    multinode = metafunc.definition.get_closest_marker("multinode") is not None
    try:  # a usage error, raised once collection is done (here pytest would call it an error)
        if layouts.wanted(metafunc, named):
            spellings = layouts.asked(metafunc.definition, state.settings.layouts)
            if "cluster" in named:
                pairs = layouts.pairs(metafunc.definition.nodeid, state.ladder(multinode),
                                      spellings)
    except pytest.UsageError as exc:
        metafunc.config.stash.setdefault(LAYOUT_ERRORS, []).append(str(exc))
        spellings = pairs = None
    if "cluster" in named:
        topologies = state.ladder(multinode)
        if pairs is None:
            metafunc.parametrize("cluster", topologies, ids=[t.id for t in topologies],
                                 indirect=True)
        else:
            # One axis, so that a case's id reads 1n2d-fsdp2: the degrees resolved on the
            # topology's ranks (a layout runs where they divide them).
            metafunc.parametrize(("cluster", "layout"), [(t, s) for t, s, _ in pairs],
                                 ids=[ident for _, _, ident in pairs], indirect=True)
    elif spellings is not None:
        metafunc.parametrize("layout", spellings, ids=[s.text for s in spellings],
                             indirect=True)
    if "sweep" in named:
        try:
            sweeps.parametrize(metafunc, state.settings.sweep,
                               state.settings.batch_size is not None, state.settings.size,
                               state.device_type)
        except pytest.UsageError as exc:
            metafunc.config.stash.setdefault(LAYOUT_ERRORS, []).append(str(exc))
    if "amp" in named:
        metafunc.parametrize("amp", state.settings.precisions or PRECISIONS, indirect=True)
    if "compiler" in named:
        metafunc.parametrize(
            "compiler", state.compilers_for(getattr(metafunc.module, "FRAMEWORK", None)),
            indirect=True)


def _under_xdist(config: pytest.Config) -> bool:
    """An xdist worker, or a controller that hands tests to workers (``-n N``)."""
    return hasattr(config, "workerinput") or bool(
        config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None))


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Cluster:
    """The topology of this case (nodes, devices per node, device type, backend) and
    ``run(spec)``, which runs the worker on every rank and returns their JSON results."""
    if _under_xdist(request.config):
        # Each xdist worker would start its own training ranks on the same cores and devices.
        pytest.fail("pytest-dlperf: perf cases cannot run under pytest-xdist: every xdist "
                    "worker would start its own training ranks on the same cores and GPUs, and "
                    "each would skew the others' figures; run them in one process "
                    "(-p no:xdist, or -n 0)", pytrace=False)
    state = request.config.stash[STATE]
    topology = getattr(request, "param", None) or state.ladder(multinode=False)[-1]
    gpus = len(state.hardware.gpus)
    if (state.launcher.all_nodes_here and topology.device_type == "cuda"
            and topology.world_size > gpus):
        pytest.skip(f"{topology.id} needs {topology.world_size} GPUs and local mode runs every "
                    f"node on this host, which has {gpus}; lower --devices-per-node or run it "
                    "on a cluster")
    cores = state.hardware.cpu_count
    if (state.launcher.all_nodes_here and topology.device_type == "cpu"
            and topology.world_size > cores and not state.settings.oversubscribe):
        pytest.skip(f"{topology.id} runs {topology.world_size} ranks and local mode runs every "
                    f"node on this host, which has {cores} usable cores: ranks sharing cores "
                    "time the contention (and run many times slower); --dlperf-oversubscribe "
                    "runs it anyway, or run it on a cluster")
    if not state.launcher.can_run(topology):
        nodes, _ = state.launcher.launched_shape or ("?", None)
        pytest.skip(f"{topology.id}: pytest was launched as a {nodes}-node job with its own "
                    "ranks; external mode runs only that topology")
    return Cluster(topology, state.launcher, state.work_root, state.settings.timeout,
                   state.settings.python)


@pytest.fixture
def amp(request: pytest.FixtureRequest) -> Precision:
    """The precision of this case: fp32, or AMP (fp16 + loss scaling on CUDA, bf16 on CPU)."""
    state = request.config.stash[STATE]
    name = getattr(request, "param", "fp32")
    if (name == "amp" and state.device_type == "cpu" and not state.hardware.cpu_bf16
            and state.settings.precisions is None):
        pytest.skip("AMP on this CPU would time bf16 emulation (no avx512_bf16 or amx_bf16 "
                    "among its flags; BERT-base's bf16 step ran ~20x slower than fp32 on one): "
                    "--dlperf-precisions fp32,amp runs it anyway")
    optin.amp_case(request, state, name)
    return Precision(name, state.device_type)


@pytest.fixture
def layout(request: pytest.FixtureRequest, cluster: Cluster) -> Layout:
    """How this case's ranks share the work (``pytest_dlperf.core.parallel.Layout``): its
    data-parallel, FSDP, tensor- and pipeline-parallel degrees on the case's ranks."""
    spelling = getattr(request, "param", None)
    optin.layout_case(request, request.config.stash[STATE], spelling)
    if spelling is None:
        return Layout(dp=cluster.world_size)
    return layouts.resolved(request.node.nodeid, spelling, cluster.world_size)


@pytest.fixture
def compiler(request: pytest.FixtureRequest) -> str:
    """How the training step runs: ``eager``, or ``compiled`` (each framework's compiler, as its
    adapter's ``COMPILER`` names it). Compile time is reported on its own (``first_step_s``),
    never in throughput."""
    return str(getattr(request, "param", "eager"))


@pytest.fixture
def sweep(request: pytest.FixtureRequest) -> sweeps.Sweep:
    """This case's rung of a swept size (``--dlperf-sweep``, ``@pytest.mark.sweep``), and the
    sweep's rungs measured so far in this session (docs/sweeps.md)."""
    return sweeps.fixture_value(request, request.config.stash[STATE].sweeps)


@pytest.fixture
def throughput_meter(request: pytest.FixtureRequest, cluster: Cluster,
                     amp: Precision) -> ThroughputMeter:
    """Runs a workload on ``cluster`` under the protocol and judges it against its baseline."""
    return ThroughputMeter(request.node, cluster, amp, request.config.stash[STATE])


def _machine_info(config: pytest.Config) -> dict[str, Any]:
    """pytest-benchmark's machine info as its own files get it: through its hooks, so that a
    conftest's ``pytest_benchmark_generate_machine_info`` / ``..._update_machine_info`` runs."""
    hook = config.hook
    if not hasattr(hook, "pytest_benchmark_generate_machine_info"):
        # Its plugin is off (-p no:benchmark): no hook spec, and pytest refuses a conftest
        # implementing an unknown pytest_ hook, so no override exists to skip. The package is
        # still installed (the results file is its format): its own function then.
        from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info

        return dict(pytest_benchmark_generate_machine_info())
    info = hook.pytest_benchmark_generate_machine_info(config=config)
    hook.pytest_benchmark_update_machine_info(config=config, machine_info=info)
    return dict(info)


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is None or not state.is_reporter or _under_xdist(session.config):
        return
    if session.exitstatus == pytest.ExitCode.USAGE_ERROR:
        return  # refused before anything ran: a usage error writes nothing
    if state.settings.json is not None:
        unjudged = [case.to_json() for case in session.config.stash.get(NOT_JUDGED, [])]
        write_json_atomic(state.settings.json, results_json(
            state.reports, state.commit, _machine_info(session.config), unjudged,
            [record.to_json() for record in state.sweeps.values()]))
    saved = state.history is None or state.history.save(state.reports)
    if not saved and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for hint in (config.stash.get(MULTINODE_HINT, None), optin.summary_line(config)):
        if hint is not None:
            terminalreporter.write_line(hint, yellow=True)
    state = config.stash.get(STATE, None)
    if state is not None and state.reports:
        _throughput_summary(terminalreporter, state)
    if state is not None:
        sweeps.write_summary(terminalreporter, list(state.sweeps.values()),
                             state.settings.size, state.sizes_used if state.reports else None)
    # The last word: what stayed unjudged, apart from what was judged and passed or failed,
    # and what it measured (a run of busy cases only printed no figures after minutes).
    busy = [c for c in config.stash.get(NOT_JUDGED, []) if c.outcome == MACHINE_BUSY]
    if busy:
        table = busy_rows([c.to_json() for c in busy])
        if table:
            terminalreporter.write_sep("-", "pytest-dlperf: measured beside a busy machine, not "
                                            "judged (the machine's figures, not the code's)")
            for line in text_table(table, BUSY_HEADER):
                terminalreporter.write_line(line)
        terminalreporter.write_line(f"pytest-dlperf: {summary_line(len(busy))}", red=True)


def _throughput_summary(terminalreporter: Any, state: SessionState) -> None:
    proto, settings = state.settings.protocol, state.settings
    terminalreporter.write_sep(
        "-", f"pytest-dlperf: training throughput ({proto.name} protocol: {proto.warmup_steps} "
        f"warm-up, {proto.steps} timed steps x {proto.repeats} repeats over "
        f"{settings.launches} launch(es), median; machine {settings.machine})")
    benchmarks = [benchmark_entry(r) for r in state.reports]
    for line in text_table(rows(benchmarks)):
        terminalreporter.write_line(line)
    for line in table_notes(benchmarks):
        terminalreporter.write_line(line)
    network = next((r.network for r in state.reports if r.network), None)
    if network:  # so nobody takes a bridge's figure for a data-centre NIC
        measured = (f", measured {network['measured']} (node 0 to node 1, one TCP stream)"
                    if network.get("measured") else "")
        terminalreporter.write_line(f"nodes: {network['nodes']}; link {network['link']}"
                                    f"{measured}")
    sides, ab_table = ab_rows(benchmarks)
    if ab_table:
        terminalreporter.write_sep("-", f"pytest-dlperf: A/B, head against base ({sides})")
        for line in [*text_table(ab_table, AB_HEADER), *ab_code_lines(benchmarks)]:
            terminalreporter.write_line(line)
    pivot = frameworks_side_by_side(benchmarks)
    if pivot is not None:
        terminalreporter.write_sep("-", "pytest-dlperf: frameworks side by side (throughput, "
                                        "speedup over 1n1d)")
        header, table = pivot_rows(pivot)
        for line in text_table(table, header):
            terminalreporter.write_line(line)
    changes = change_lines(state.reports)
    if changes:
        terminalreporter.write_sep("-", f"pytest-dlperf: baselines changed in "
                                        f"{state.settings.baselines}")
        for line in changes:
            terminalreporter.write_line(line)
    if state.settings.json is not None:
        terminalreporter.write_line(f"results written to {state.settings.json}")
    if state.history is not None and state.history.line is not None:
        terminalreporter.write_line(f"pytest-dlperf: history: {state.history.line}")
