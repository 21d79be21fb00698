"""What the real clusters on this machine (``slurm.cluster``, ``ray.cluster``) share: their shape (a
state folder, nodes node1..N, their hosts on a ``fabric``, daemons known by pid, timings), and
how one is stopped from its record alone when its owner is gone."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from . import fabric
from .daemons import Daemon, stop_daemons

Cluster = TypeVar("Cluster", bound="LocalCluster")


@dataclass
class LocalCluster:
    """``nodes`` nodes (node1, node2, ...) and whatever serves them; ``start()``/``stop()`` or
    a ``with`` block. Subclasses write ``start`` and ``stop``."""

    state_dir: Path
    nodes: int = 2
    hosts: dict[str, fabric.Host] = field(default_factory=dict)
    daemons: list[Daemon] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    _fabric: fabric.Fabric | None = None
    error: ClassVar[type[Exception]] = RuntimeError

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).absolute()
        if self.nodes < 1:
            raise self.error(f"nodes={self.nodes}: a cluster needs at least one node")

    def __enter__(self: Cluster) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    @property
    def node_names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.nodes + 1)]

    def attached(self: Cluster, record: dict[str, Any]) -> Cluster:
        """This cluster as its record says it runs (its hosts and daemons): to run clients
        on, not to stop (its keeper owns it)."""
        self.hosts = {name: fabric.Host(**host) for name, host in record["hosts"].items()}
        self.daemons = [Daemon(**daemon) for daemon in record["daemons"]]
        return self


def stop_recorded(record: dict[str, Any], stop: Callable[[list[Daemon]], object],
                  records: Callable[[Path], list[Path]]) -> None:
    """Stop a cluster from its record alone (its owner gone): its daemons (``stop``), then its
    fabric; then the record's files (``records`` of its state folder)."""
    stop([Daemon(**d) for d in record.get("daemons", [])])
    tag = record.get("fabric")
    path = fabric.RECORDS / f"{tag}.json"
    if tag and path.exists():
        try:
            fabric.teardown(json.loads(path.read_text()))
        except ValueError:
            pass
        path.unlink(missing_ok=True)
    state = Path(record.get("state_dir", ""))
    if state.is_absolute():
        for found in records(state):
            found.unlink(missing_ok=True)


__all__ = ["LocalCluster", "stop_daemons", "stop_recorded"]
