"""One pytest session's view of the cluster: settings, hardware, launcher, the topology ladder
and the scratch folder; everything the fixtures need that outlives a single case.

``SessionState`` is built from the settings in ``pytest_configure`` (no I/O: ``pytest --help``
stays cheap); ``start()``, called from ``pytest_sessionstart``, does the rest in explicit
steps (pick the launcher, detect the hardware, settle the device type and devices per node,
check the nodes, make the scratch folder), raising ``pytest.UsageError`` for bad requests
before anything is collected.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..core.lifeline import claim, sweep
from ..core.phases import Phases
from ..core.topology import Hardware, Topology, detect_hardware, make_topology
from ..launch import BUILTIN_LAUNCHERS, Launcher, detect, make_builtin
from ..launch.protocol import missing_members
from ..store.baselines import BaselineStore
from ..verdict.drift import Drift
from ..verdict.mfu import FlopsCount
from ..verdict.record import CaseReport
from .absetup import AbSetup
from .history import HistoryKeeper
from .live import LiveLine
from .settings import Settings
from .sweep import SweepRecord

# (the test's parent node id, its function name, its other parameters' values by identity) ->
# {topology id: node id}: the same test on another rung of the ladder. Identity, because a
# parameter value is one object shared by every case of the product (pytest's ``indices``
# number parameter sets across the whole product, not per argument).
SiblingKey = tuple[str, str, tuple[tuple[str, int], ...]]


@dataclass(frozen=True)
class LauncherHooks:
    """How the session gets its launcher: the names on offer and the maker of one
    (``pytest_dlperf_launcher_names`` and ``pytest_dlperf_make_launcher`` through
    ``config.hook``, so that a user's run; by default the built-in ones alone), and where
    ``--dlperf-launcher``'s value came from, for a message."""

    names: Callable[[], list[str]] = lambda: list(BUILTIN_LAUNCHERS)
    make: Callable[[str, dict[str, str]], Launcher | None] = make_builtin
    source: str = "--dlperf-launcher"
    detect: Callable[[dict[str, str]], str] = detect  # what ``auto`` picks here

    @classmethod
    def of(cls, config: pytest.Config, source: str) -> LauncherHooks:
        def names() -> list[str]:
            lists = config.hook.pytest_dlperf_launcher_names(config=config)
            return list(dict.fromkeys(name for names in lists for name in names))

        def make(name: str, environ: dict[str, str]) -> Launcher | None:
            made: Launcher | None = config.hook.pytest_dlperf_make_launcher(
                config=config, name=name, environ=environ)
            return made

        def detected(environ: dict[str, str]) -> str:
            name: str = config.hook.pytest_dlperf_detect_launcher(config=config,
                                                                 environ=environ)
            return name

        return cls(names, make, source, detected)


@dataclass(frozen=True)
class SessionSetup:
    """What ``start`` settled: fixed for the session."""

    launcher: Launcher
    hardware: Hardware
    device_type: str
    devices_per_node: int  # each node's, where the nodes of a scaling case run
    # A single-node case's full node: the host's, as no other node shares it (with --nodes 2
    # on a 2-core host a scaling case's nodes get one rank each, a single-node case two).
    node_devices: int
    work_root: Path


@dataclass
class SessionState:
    settings: Settings
    store: BaselineStore
    rootpath: Path
    reports: list[CaseReport] = field(default_factory=list)
    siblings: dict[SiblingKey, dict[tuple[str, str | None], str]] = field(default_factory=dict)
    # FLOPs per sample, counted once per workload, recipe and sizes in a session.
    flops_counts: dict[str, FlopsCount] = field(default_factory=dict)
    # 1n1d references measured in this session (not reported), by what they train: their
    # median and phases (plugin.meter).
    references: dict[str, tuple[float, Phases | None]] = field(default_factory=dict)
    # Asked once for the commit the measured code is at (the pytest_dlperf_commit_info hook).
    commit_info: Callable[[], dict[str, Any] | None] = dict
    launchers: LauncherHooks = field(default_factory=LauncherHooks)
    history: HistoryKeeper | None = None  # --dlperf-history, opened by the reporting process
    live: LiveLine | None = None  # live progress of the running case (reporting process)
    ab: AbSetup | None = None  # --dlperf-ab / --dlperf-ab-python: the base side
    # The machine's drift between runs by (machine, device type), pooled over its baselines
    # once a session (``baseline.machine_drift``).
    drifts: dict[tuple[str | None, str], dict[str, Drift]] = field(default_factory=dict)
    # Each sweep's rungs as they ran, by the test's id without its rung (plugin.sweep).
    sweeps: dict[str, SweepRecord] = field(default_factory=dict)
    sizes_used: set[str] = field(default_factory=set)  # --dlperf-size's, by a case's workload
    gemm: list[dict[str, Any] | None] = field(default_factory=list)  # measured, once
    _commit: dict[str, Any] | None = None
    _started: SessionSetup | None = None

    # -- pytest_sessionstart --------------------------------------------------------------

    def start(self, environ: dict[str, str]) -> None:
        launcher = self._pick_launcher(environ)
        hardware = detect_hardware()
        device_type = self._device_type(hardware)
        devices = self._devices_per_node(launcher, hardware, device_type)
        alone = self._devices_per_node(launcher, hardware, device_type, sharing=1)
        self._check_nodes(launcher, devices, device_type)
        self.ab = AbSetup.open(self.settings, self.rootpath)
        if self.ab is not None and not launcher.can_add_repeats:
            raise pytest.UsageError(
                f"pytest-dlperf: --dlperf-ab/--dlperf-ab-python needs a launcher that starts "
                f"the case's processes itself (local or slurm), not {launcher.name}: each pair "
                "is two fresh launches")
        work_root = self._make_work_root(launcher)
        self._started = SessionSetup(launcher, hardware, device_type, devices, alone, work_root)

    def _pick_launcher(self, environ: dict[str, str]) -> Launcher:
        hooks = self.launchers
        auto = self.settings.launcher == "auto"
        name = hooks.detect(environ) if auto else self.settings.launcher
        known = hooks.names()
        if name not in known:
            if auto:
                raise pytest.UsageError(
                    f"pytest-dlperf: launcher auto ({hooks.source}): "
                    f"pytest_dlperf_detect_launcher picked "
                    f"{name!r}, which no pytest_dlperf_launcher_names lists (known: "
                    f"{', '.join(known)}); list it in the hook that makes it")
            raise pytest.UsageError(
                f"pytest-dlperf: bad value for {hooks.source}: no launcher is called {name!r} "
                f"(known: auto, {', '.join(known)}); a launcher of your own is a "
                "pytest_dlperf_make_launcher hook that makes it and a "
                "pytest_dlperf_launcher_names hook that lists its name "
                "(docs/adding-a-launcher.md)")
        try:
            launcher = hooks.make(name, environ)
        except LookupError as exc:
            raise pytest.UsageError(f"pytest-dlperf: {exc}") from None
        if launcher is None:
            raise pytest.UsageError(
                f"pytest-dlperf: {hooks.source}: {name!r} is listed by "
                "pytest_dlperf_launcher_names, but no pytest_dlperf_make_launcher made it (each "
                "implementation returned None); make it in the hook that lists it")
        lacking = missing_members(launcher)
        if lacking:
            raise pytest.UsageError(
                f"pytest-dlperf: {hooks.source}: pytest_dlperf_make_launcher made "
                f"{type(launcher).__name__} for {name!r}, which is no launcher: it lacks "
                f"{', '.join(lacking)} (subclass pytest_dlperf.launch.Launcher for the defaults, "
                "and write rendezvous, start, collect and stop)")
        if self.settings.link is not None:
            check_link(launcher, self.settings.link)
            launcher.link = self.settings.link
        return launcher

    def _device_type(self, hardware: Hardware) -> str:
        wanted = self.settings.device
        if wanted == "cuda" and not hardware.gpus:
            raise pytest.UsageError(
                "pytest-dlperf: --dlperf-device=cuda, but no NVIDIA GPU was found through NVML "
                "(pynvml); use --dlperf-device=cpu or run on a GPU host")
        return hardware.device_type if wanted == "auto" else wanted

    def _devices_per_node(self, launcher: Launcher, hw: Hardware, device_type: str,
                          sharing: int | None = None) -> int:
        """Devices per node: as given, else the node's (on CPU, its cores shared out among the
        ``sharing`` nodes on this host: by default every local node)."""
        wanted = self.settings.devices_per_node
        launched = launcher.launched_shape
        if launched is not None:  # external: the job was started with its own shape
            return launched[1]
        if device_type == "cuda":
            have, what = len(hw.gpus), "NVIDIA GPUs"
        else:  # one core at least per simulated device, or DDP oversubscribes the CPU
            have, what = hw.cpu_count, "usable CPU cores (one per simulated device)"
        have, what = launcher.node_devices(device_type) or (have, what)
        if wanted is None:
            if device_type == "cuda":
                return have
            # Local nodes share this host's cores: keep every node's ranks within them (one per
            # node at least). 8 single-thread ranks on 2 cores ran many times slower.
            if sharing is None:
                sharing = self.settings.nodes if launcher.all_nodes_here else 1
            return max(1, min(2, have // sharing))
        # --dlperf-oversubscribe: CPU ranks sharing cores anyway (the path, not a figure: a
        # 4-rank layout on a 2-core machine).
        if wanted > have and not (device_type == "cpu" and self.settings.oversubscribe):
            more = (" (or --dlperf-oversubscribe to run more ranks than cores anyway)"
                    if device_type == "cpu" else "")
            raise pytest.UsageError(
                f"pytest-dlperf: --devices-per-node={wanted}, but this host has {have} {what}; "
                f"pass --devices-per-node {have} or less{more}")
        return wanted

    def _check_nodes(self, launcher: Launcher, devices: int, device_type: str) -> None:
        """The cluster's own word on --nodes x --devices-per-node (an allocation, a Ray
        cluster's alive nodes)."""
        why = launcher.why_not_shape(self.settings.nodes, devices, device_type)
        if why:
            raise pytest.UsageError(f"pytest-dlperf: {why}")

    def _make_work_root(self, launcher: Launcher) -> Path:
        """Per-session scratch for the cases' specs and results. Remote nodes must see it,
        so outside local mode it lives under the rootdir, not in this host's /tmp. Scratch
        left by runs that were killed (SIGKILL, a lost node) goes first."""
        parent = Path(tempfile.gettempdir())
        if not launcher.all_nodes_here:
            parent = self.rootpath / ".pytest-dlperf"
            parent.mkdir(exist_ok=True)
        sweep(parent, "pytest-dlperf-*")
        work_root = Path(tempfile.mkdtemp(prefix="pytest-dlperf-", dir=parent))
        claim(work_root)
        return work_root

    # -- what start settled ---------------------------------------------------------------

    @property
    def started(self) -> SessionSetup:
        if self._started is None:
            raise RuntimeError("pytest-dlperf's session has not started (pytest_sessionstart)")
        return self._started

    @property
    def launcher(self) -> Launcher:
        return self.started.launcher

    @property
    def hardware(self) -> Hardware:
        return self.started.hardware

    @property
    def device_type(self) -> str:
        return self.started.device_type

    @property
    def devices_per_node(self) -> int:
        return self.started.devices_per_node

    @property
    def work_root(self) -> Path:
        return self.started.work_root

    @property
    def compilers(self) -> tuple[str, ...]:
        """The compiler axis: as given, else eager on CPU and both on CUDA."""
        if self.settings.compilers is not None:
            return self.settings.compilers
        return ("eager", "compiled") if self.device_type == "cuda" else ("eager",)

    def compilers_for(self, framework: object) -> tuple[str, ...]:
        """The compiler axis of a test module whose ``FRAMEWORK`` is ``framework`` (as
        perf_tests' modules name theirs; None where it names none): by default, a framework
        that has no eager mode (its adapter's ``eager_unavailable``: JAX) gets its compiled
        one instead of cases that would all skip."""
        compilers = self.compilers
        if self.settings.compilers is not None or not isinstance(framework, str) \
                or "compiled" in compilers:
            return compilers
        from .adapters import Adapter

        try:
            adapter = Adapter.resolve(framework)
        except LookupError:
            return compilers  # the case says what is wrong with the name, when it runs
        if adapter.unavailable("eager", self.device_type):
            return tuple(c for c in compilers if c != "eager") + ("compiled",)
        return compilers

    def ladder(self, multinode: bool) -> list[Topology]:
        """DLPerf's ladder: 1 device, then a full node; multinode cases add 2, 4, ... nodes."""
        per_node = self.devices_per_node if multinode else self.started.node_devices
        launched = self.launcher.launched_shape
        max_nodes = launched[0] if launched is not None else self.settings.nodes
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

    @property
    def is_reporter(self) -> bool:
        """Only rank 0 of an externally launched job writes results and tables."""
        return self._started is None or self._started.launcher.is_reporter

    # -- the same test on another topology -----------------------------------------------

    def index_siblings(self, items: list[pytest.Item]) -> None:
        """Remember every collected case by topology, before ``-k``/``-m`` deselect any: a
        scaling case finds its 1n1d sibling's node id (pytest's own id, ``ids=`` and object
        parameters included) even when that case is not run."""
        for item in items:
            key, topology_id = _sibling_key(item)
            if key is not None and topology_id is not None:
                self.siblings.setdefault(key, {})[(topology_id, _layout_text(item))] = \
                    item.nodeid

    def case_at(self, node: pytest.Item, topology: Topology) -> str | None:
        """The node id of this test with its ``cluster`` parameter at ``topology`` (and its
        ``layout``, where it has one, plain data parallelism: what one device does alone)."""
        key, _ = _sibling_key(node)
        if key is None:
            return None
        found = self.siblings.get(key, {})
        return found.get((topology.id, None)) or found.get((topology.id, "dp"))

    @property
    def commit(self) -> dict[str, Any]:
        """The commit the measured code is at (``pytest_dlperf_commit_info``), read once."""
        if self._commit is None:
            self._commit = self.commit_info() or {}
        return self._commit

    def open_history(self, source: str) -> None:
        """``--dlperf-history``, opened by the reporting process before anything trains."""
        if self.settings.history is not None and self.is_reporter:
            self.history = HistoryKeeper.open(self.settings, lambda: self.commit, source)

    def close(self) -> None:
        try:
            if self.history is not None:
                self.history.close()
            if self.ab is not None:
                self.ab.close()
        finally:
            if self._started is not None:
                self._started.launcher.close()
        if self._started is not None:
            shutil.rmtree(self._started.work_root, ignore_errors=True)


def check_link(launcher: Launcher, link: Any) -> None:
    """--dlperf-link shapes the links of local nodes that are hosts of their own; say so where
    it cannot be given (another launcher, no namespaces here, a delay the kernel cannot add)."""
    from ..launch.onehost import fabric

    where = "--dlperf-link"
    if not link.shaped:  # unshaped: what every launcher gives
        return
    if launcher.name != "local":
        raise pytest.UsageError(
            f"pytest-dlperf: {where}={link} shapes local nodes' links, but the launcher is "
            f"{launcher.name}: a real cluster's links are what they are; drop {where}")
    if not launcher.node_hosts:
        raise pytest.UsageError(
            f"pytest-dlperf: {where}={link} needs local nodes as network hosts, which this "
            f"process cannot make ({launcher.why_no_node_hosts()}); run as root, or where "
            f"user namespaces may make veth pairs, or drop {where}")
    if link.delay_ms is not None and not fabric.kernel_has_netem():
        raise pytest.UsageError(
            f"pytest-dlperf: {where}={link} asks for a delay, but this kernel has no netem "
            "qdisc (sch_netem; no module can be loaded), so no delay can be added; give the "
            "rate alone (e.g. --dlperf-link 1gbit)")


def _sibling_key(item: Any) -> tuple[SiblingKey | None, str | None]:
    callspec = getattr(item, "callspec", None)
    if callspec is None or "cluster" not in callspec.params:
        return None, None
    topology = callspec.params["cluster"]
    others = tuple(sorted((name, id(value)) for name, value in callspec.params.items()
                          if name not in ("cluster", "layout")))
    parent = item.parent.nodeid if item.parent is not None else ""
    return (parent, getattr(item, "originalname", item.name), others), getattr(topology, "id", None)



def _layout_text(item: Any) -> str | None:
    """The layout a case was parametrized with, as spelled (None: no layout axis)."""
    spelling = getattr(getattr(item, "callspec", None), "params", {}).get("layout")
    return getattr(spelling, "text", None)
