"""What every launch mode starts from (``Launcher``: the defaults of ``protocol.LauncherProtocol``),
how a launch fails (``LaunchError``), and what the ``cluster`` fixture hands a test (``Cluster``:
a topology and a way to run a spec on it). The launch modes (``local``, ``slurm``, ``external``)
build on this module; the package's face (``launch/__init__``) makes the built-in ones."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.ports import free_loopback_port
from ..core.spec import RankSpec
from ..core.topology import Topology
from .protocol import Rendezvous, run_launch

# Follows rank 0's progress file at the path for as long as the context lasts.
Watch = Callable[[Path], AbstractContextManager[None]]


@dataclass
class LaunchError(Exception):
    """The job did not produce a result from every rank."""

    summary: str
    rank_errors: dict[int, str] = field(default_factory=dict)
    missing_ranks: list[int] = field(default_factory=list)
    log_tail: str = ""
    kind: str = "failed"  # failed | timeout | diverged | out_of_memory | interrupted

    def __str__(self) -> str:
        parts = [self.summary]
        # Ranks that failed alike (data parallelism: every rank runs the same step) are shown
        # once, under all their numbers.
        alike: dict[str, list[int]] = {}
        for rank, text in sorted(self.rank_errors.items()):
            alike.setdefault(text.rstrip(), []).append(rank)
        for text, ranks in alike.items():
            who = f"rank {ranks[0]}" if len(ranks) == 1 else \
                f"ranks {', '.join(map(str, ranks))}"
            parts.append(f"--- {who} ---\n{text}")
        if self.missing_ranks:
            parts.append(f"ranks with no result: {self.missing_ranks}")
        if self.log_tail and not self.rank_errors:
            parts.append(f"--- launcher log (tail) ---\n{self.log_tail.rstrip()}")
        return "\n".join(parts)


class Launcher:
    """What every launch mode offers. The defaults describe a launcher that starts the ranks
    itself (local, slurm); external mode overrides the parts that differ."""

    name = "?"
    all_nodes_here = False  # every node's workers share this host's cores and devices
    link: Any = None  # local nodes' link (core.link.Link), where the launcher shapes one
    # Whether a case can be launched again for extra repeats when its verdict is inconclusive.
    can_add_repeats = True

    # -- one launch, phase by phase (``protocol.run_launch`` drives them) ------------------

    def rendezvous(self, topology: Topology, run_dir: Path) -> Rendezvous:
        """Where the ranks meet; by default on this host's loopback, at a free port (ranks that
        all run on this host)."""
        import uuid

        return Rendezvous("127.0.0.1", free_loopback_port(), f"dlperf-{uuid.uuid4().hex[:12]}")

    def start(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
              meeting: Rendezvous, timeout_s: float) -> Any:
        """Start every rank of one launch; what the later phases need is returned."""
        raise NotImplementedError(f"the {self.name} launcher does not say how to start ranks")

    def collect(self, launch: Any, timeout_s: float) -> list[dict[str, Any]]:
        """Every rank's result, ordered by rank, or ``LaunchError``."""
        raise NotImplementedError(f"the {self.name} launcher does not say how to collect")

    def stop(self, launch: Any) -> None:
        """Tear down what ``start`` started (nothing, by default)."""

    def run(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
            timeout_s: float) -> list[dict[str, Any]]:
        """One launch through the four phases (``protocol.run_launch``)."""
        return run_launch(self, spec, topology, run_dir, timeout_s)

    @property
    def launched_shape(self) -> tuple[int, int] | None:
        """(nodes, devices per node) when the job was started outside pytest-dlperf."""
        return None

    @property
    def is_reporter(self) -> bool:
        """Whether this process judges, writes baselines and reports (rank 0 only, externally)."""
        return True

    @property
    def isolation(self) -> str | None:
        return None

    def can_run(self, topology: Topology) -> bool:
        return True

    def why_not_shape(self, nodes: int, devices_per_node: int, device_type: str) -> str | None:
        """Why the cluster cannot hold ``nodes`` x ``devices_per_node`` (None: it can, or the
        launcher cannot tell); asked once, at the session's start."""
        return None

    def node_devices(self, device_type: str) -> tuple[int, str] | None:
        """The devices of ``device_type`` a node of the cluster has, and what they are in words,
        where the launcher knows better than this host (a Slurm allocation's GPUs per node);
        None: this host's count stands for every node's."""
        return None

    def link_fingerprint(self, topology: Topology) -> str | None:
        """What a case's fingerprint says of the network between its nodes (None: nothing)."""
        return None

    def network(self, topology: Topology) -> dict[str, Any] | None:
        """The nodes' network, as the results record it (None: not known to the launcher)."""
        return None

    @property
    def node_hosts(self) -> bool:
        """Whether local nodes are network hosts of their own (their links can be shaped)."""
        return False

    def why_no_node_hosts(self) -> str:
        return f"the {self.name} launcher's nodes are what the cluster gives"

    def close(self) -> None:
        """At the end of the session: take down what the launcher built for it."""

    def share_outcome(self, outcome: dict[str, str], timeout_s: float) -> dict[str, str]:
        """The case's outcome as every rank must see it; here the caller's own."""
        return outcome


class Cluster:
    """What the ``cluster`` fixture hands a test: a topology and a way to run a workload on it."""

    def __init__(self, topology: Topology, launcher: Launcher, work_root: Path, timeout_s: float,
                 pythons: dict[str, str] | None = None):
        self.topology = topology
        self.launcher = launcher
        self.work_root = work_root
        self.timeout_s = timeout_s
        # framework -> the interpreter its ranks run under (--dlperf-python); else pytest's own
        self.pythons = dict(pythons or {})

    def at(self, topology: Topology) -> Cluster:
        """The same launcher and settings on another topology."""
        return Cluster(topology, self.launcher, self.work_root, self.timeout_s, self.pythons)

    @property
    def nodes(self) -> int:
        return self.topology.nodes

    @property
    def devices_per_node(self) -> int:
        return self.topology.devices_per_node

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def device_type(self) -> str:
        return self.topology.device_type

    @property
    def backend(self) -> str:
        return self.topology.backend

    def run(self, spec: RankSpec, watch: Watch | None = None) -> list[dict[str, Any]]:
        """Run the worker on every rank; each run gets a fresh folder, removed afterwards.
        ``watch``: follows rank 0's progress file (``progress.LiveLine.watch``) while the
        ranks run; not in external mode, where this process is a rank itself."""
        import contextlib
        import shutil
        import tempfile

        self.work_root.mkdir(parents=True, exist_ok=True)
        run_dir = Path(tempfile.mkdtemp(prefix=f"{self.topology.id}-", dir=self.work_root))
        try:
            live = watch is not None and self.launcher.name != "external"
            progress = run_dir / "progress.jsonl"
            # (a duet side's spec carries its own cores, and its threads with them)
            threads = spec.threads if spec.cpus is not None else self.topology.threads_per_worker
            placed = spec.with_(threads=threads,
                                device_type=self.topology.device_type,
                                python=self.pythons.get(spec.framework),
                                progress=str(progress) if live else None)
            with (watch(progress) if live and watch is not None else contextlib.nullcontext()):
                return run_launch(self.launcher, placed.to_json(), self.topology, run_dir,
                                  self.timeout_s)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"Cluster({self.topology.id}, {self.topology.device_type}, {self.launcher.name})"
