"""What a launcher is: one small protocol (``LauncherProtocol``), the record of where a launch's
ranks meet (``Rendezvous``), and the one place that drives a launch through its phases
(``run_launch``), as pytest-xdist's ``DSession`` drives any ``Scheduling``.

A launch has four phases, each a method of the launcher:

1. ``rendezvous``: where the ranks will meet (the address and port rank 0's store listens at,
   a run id) -- chosen by the launcher, since only it knows where the ranks will run;
2. ``start``: start every rank, told where to meet; returns the launcher's own handle;
3. ``collect``: wait for every rank's result, through the channel the launcher chose (the run
   folder's files for local and slurm, a c10d store for external; a Ray launcher: its actors'
   return values), and return them in rank order, or raise ``LaunchError``;
4. ``stop``: tear down what ``start`` started, whatever happened (it runs on Ctrl-C too).

The rest of the protocol is what the plugin asks of a launcher about the session (its shape,
who reports, what the results say of its network); ``base.Launcher`` gives every one of them a
default, so a new launcher subclasses it and writes the four phases. A launcher comes from the
``pytest_dlperf_make_launcher`` hook (docs/adding-a-launcher.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from ..core.topology import Topology

Handle = TypeVar("Handle")


@dataclass(frozen=True)
class Rendezvous:
    """Where one launch's ranks meet: rank 0's store at ``host``:``port`` (torchrun's c10d
    rendezvous, or torch's env:// store the ranks' ``MASTER_ADDR``/``MASTER_PORT`` name), and
    the launch's id (torchrun's ``--rdzv-id``; a key prefix in a shared store)."""

    host: str
    port: int
    run_id: str

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


@runtime_checkable
class LauncherProtocol(Protocol[Handle]):
    """What every launcher offers the plugin. ``Handle``: what ``start`` returns and the later
    phases take (the started processes, a job's id, a list of actors)."""

    name: str  # as --dlperf-launcher spells it, and the results record it
    all_nodes_here: bool  # every node's ranks share this host's cores and devices
    can_add_repeats: bool  # a case can be launched again (extra repeats, A/B pairs)
    link: Any  # local nodes' link (core.link.Link), where the launcher shapes one

    # -- one launch, phase by phase (``run_launch``) -------------------------------------

    def rendezvous(self, topology: Topology, run_dir: Path) -> Rendezvous: ...

    def start(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
              meeting: Rendezvous, timeout_s: float) -> Handle: ...

    def collect(self, launch: Handle, timeout_s: float) -> list[dict[str, Any]]: ...

    def stop(self, launch: Handle) -> None: ...

    # -- the session ---------------------------------------------------------------------

    @property
    def launched_shape(self) -> tuple[int, int] | None: ...

    @property
    def is_reporter(self) -> bool: ...

    @property
    def isolation(self) -> str | None: ...

    @property
    def node_hosts(self) -> bool: ...

    def can_run(self, topology: Topology) -> bool: ...

    def why_not_shape(self, nodes: int, devices_per_node: int, device_type: str
                      ) -> str | None: ...

    def node_devices(self, device_type: str) -> tuple[int, str] | None: ...

    def link_fingerprint(self, topology: Topology) -> str | None: ...

    def network(self, topology: Topology) -> dict[str, Any] | None: ...

    def why_no_node_hosts(self) -> str: ...

    def share_outcome(self, outcome: dict[str, str], timeout_s: float) -> dict[str, str]: ...

    def close(self) -> None: ...


def run_launch(launcher: LauncherProtocol[Any], spec: dict[str, Any], topology: Topology,
               run_dir: Path, timeout_s: float) -> list[dict[str, Any]]:
    """One launch of ``spec`` on ``topology``: every rank's result, ordered by rank, or
    ``LaunchError``. ``spec["python"]``, when set, is the interpreter the ranks must run under.
    ``stop`` runs whatever happens after ``start`` returned (a ``start`` that fails half-way
    stops what it started itself)."""
    meeting = launcher.rendezvous(topology, run_dir)
    launch = launcher.start(spec, topology, run_dir, meeting, timeout_s)
    try:
        return launcher.collect(launch, timeout_s)
    finally:
        launcher.stop(launch)


def missing_members(launcher: object) -> list[str]:
    """The protocol's members that ``launcher`` lacks (none: it is a launcher), for a message
    that names them where a hook hands back something else."""
    members = [*LauncherProtocol.__annotations__,
               *(name for name, value in vars(LauncherProtocol).items()
                 if not name.startswith("_") and (callable(value) or isinstance(value, property)))]
    return [member for member in members if not hasattr(launcher, member)]
