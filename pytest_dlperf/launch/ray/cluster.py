"""A real Ray cluster on this one machine: a head and N worker nodes, each its own network host
(a ``fabric`` namespace with its own address, its link shaped to ``link``), for the Ray
launcher's tests and for a user who wants to try ``--dlperf-launcher ray`` (``dlperf ray``,
``scripts/local-ray``).

Every node is one ``ray start --block`` inside its namespace (``--node-ip-address`` its
address, ``--node-name`` its name, a temporary folder of its own: the nodes' Unix sockets would
collide in one), so its GCS, raylet and workers live in that namespace. The head offers no CPU
(``--num-cpus 0``): ranks run on the worker nodes (node1, node2, ...), each offering ``cpus``
logical CPUs (by default this machine's cores, which they share); pytest, the Ray driver, runs on the head's host (``on("head", ...)``), as it would
on a real cluster's head node. Its dashboard is off; usage statistics are never sent.

``stop`` ends each ``ray start`` (SIGTERM: Ray drains and ends the node's processes), then
removes the hosts, which ends whatever still runs in them. A cluster whose owner died
(SIGKILL) is removed by the next ``sweep`` (every ``start`` runs one): its namespaces through
``fabric.sweep`` (everything in them ended), its folder from its record under ``RECORDS``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ...core.link import Link
from ..onehost import cluster as shared
from ..onehost import fabric
from ..onehost.cluster import LocalCluster
from ..onehost.daemons import Daemon, kill_now, namespace_pids, stop_daemons

RECORDS = Path("/run/pytest-dlperf/ray")
RECORD = "cluster.json"
HEAD = "head"
PORT = 6379
_READY_S = 90.0
# Ray's smallest object store is 75 MiB; ranks hand back a few KiB of JSON.
_OBJECT_STORE_BYTES = 100 * 2 ** 20
# ray start's own message once its node has joined the cluster.
_STARTED = "Ray runtime started"


class LocalRayError(RuntimeError):
    pass


def available() -> tuple[bool, str]:
    """Whether this process can start a local Ray cluster, and if not, why."""
    ok, why = fabric.available()
    if not ok:
        return False, why
    if not _ray_command():
        return False, "Ray is not installed beside this Python (pip install 'ray>=2.5')"
    return True, ""


def _ray_command() -> str | None:
    found = Path(sys.executable).with_name("ray")
    return str(found) if found.exists() else shutil.which("ray")


@dataclass
class LocalRay(LocalCluster):
    """A head and ``nodes`` worker nodes of ``cpus`` CPUs each; ``start()``/``stop()`` or a
    ``with`` block; ``address`` is the head's GCS; ``on(name, cmd)`` runs a command on a
    node's host (a driver: on the head)."""

    # Each worker node's logical CPUs: the machine's, which its nodes share (as local mode's
    # nodes do: a case's ranks get this host's cores shared out among them).
    cpus: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    link: Link = field(default_factory=Link)
    error: ClassVar[type[Exception]] = LocalRayError

    @property
    def address(self) -> str:
        return f"{self.hosts[HEAD].address}:{PORT}"

    def on(self, name: str, command: list[str]) -> list[str]:
        """``command``, run on host ``name`` (``head`` or a node), in its network namespace."""
        host = self.hosts.get(name)
        if host is None:
            raise LocalRayError(f"no host {name!r} in this cluster (hosts: "
                                f"{', '.join(self.hosts) or 'none: not started'})")
        return host.command(command)

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default this process's environment) for a driver: ``RAY_ADDRESS`` set."""
        env = dict(os.environ if base is None else base)
        env.update(RAY_ADDRESS=self.address, RAY_USAGE_STATS_ENABLED="0")
        return env

    # -- starting -------------------------------------------------------------------------

    def start(self) -> None:
        ok, why = available()
        if not ok:
            raise LocalRayError(f"cannot start a local Ray cluster: {why}")
        sweep()
        began = time.monotonic()
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._clear()
            self._fabric = fabric.Fabric(self.link)
            for name in [HEAD, *self.node_names]:
                self.hosts[name] = self._fabric.add_host(name)
            self._save()
            self.timings["fabric_s"] = time.monotonic() - began
            self._start_node(HEAD, ["--head", f"--port={PORT}", "--num-cpus=0",
                                    "--include-dashboard=false"])
            self._wait_started([HEAD])
            for name in self.node_names:
                self._start_node(name, [f"--address={self.address}", f"--num-cpus={self.cpus}"])
            self._wait_started(self.node_names)
        except BaseException:
            self.stop()
            raise
        self.timings["start_s"] = time.monotonic() - began

    def _start_node(self, name: str, role: list[str]) -> None:
        host = self.hosts[name]
        command = [str(_ray_command()), "start", "--block", *role,
                   f"--node-ip-address={host.address}", f"--node-name={name}",
                   f"--temp-dir={self.state_dir / name}", "--disable-usage-stats",
                   f"--object-store-memory={_OBJECT_STORE_BYTES}"]
        import psutil

        with open(self.state_dir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(self.on(name, command), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.environment(),
                                    start_new_session=True)
        self.daemons.append(Daemon(name, proc.pid, psutil.Process(proc.pid).create_time()))
        self._save()

    def _wait_started(self, names: list[str]) -> None:
        """Until each node's ``ray start`` says its node joined (it failed: its log)."""
        began = time.monotonic()
        waiting = list(names)
        while waiting and time.monotonic() - began < _READY_S:
            for name in list(waiting):
                text = self.log(name)
                if _STARTED in text:
                    waiting.remove(name)
                    self.timings[f"{name}_s"] = time.monotonic() - began
                elif not next(d for d in self.daemons if d.name == name).alive():
                    raise LocalRayError(f"ray start on {name} ended:\n{text[-3000:]}")
            time.sleep(0.1)
        if waiting:
            raise LocalRayError(f"{', '.join(waiting)} did not join within {_READY_S:g} s:\n"
                                + "\n".join(self.log(n)[-1500:] for n in waiting))

    def log(self, name: str) -> str:
        path = self.state_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- faults ---------------------------------------------------------------------------

    def crash(self, node: str) -> None:
        """The node dies at once: SIGKILL to everything on it (its raylet, workers, ranks);
        its address stays, so peers see their connections reset."""
        kill_now(namespace_pids(self.hosts[node].namespace))

    def restart(self, node: str) -> None:
        """``node`` joins again (after ``crash``)."""
        self.daemons = [d for d in self.daemons if d.name != node]
        self._start_node(node, [f"--address={self.address}", f"--num-cpus={self.cpus}"])
        self._wait_started([node])

    def busy(self) -> dict[str, list[str]]:
        """Per worker node, the processes besides Ray's own (ranks, and actors' workers
        still holding a rank): empty once every launch has ended."""
        import psutil

        found: dict[str, list[str]] = {}
        for name in self.node_names:
            for pid in namespace_pids(self.hosts[name].namespace):
                try:
                    line = " ".join(psutil.Process(pid).cmdline())
                except psutil.Error:
                    continue
                if "pytest_dlperf.rank.worker" in line or "RankHost" in line:
                    found.setdefault(name, []).append(f"{pid} {line[:200]}")
        return found

    # -- the record and stopping ----------------------------------------------------------

    def record(self) -> dict[str, Any]:
        import psutil

        me = psutil.Process()
        return {"owner": me.pid, "started": me.create_time(), "state_dir": str(self.state_dir),
                "fabric": self._fabric.tag if self._fabric else None, "nodes": self.nodes,
                "cpus": self.cpus, "hosts": {n: asdict(h) for n, h in self.hosts.items()},
                "daemons": [asdict(d) for d in self.daemons]}

    def _save(self) -> None:
        RECORDS.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.record(), indent=1)
        for path in (_record_path(self.state_dir), self.state_dir / RECORD):
            path.with_suffix(".tmp").write_text(text)
            os.replace(path.with_suffix(".tmp"), path)

    def _clear(self) -> None:
        """The nodes' folders and logs, and the record, in the state folder."""
        for name in [HEAD, *self.node_names]:
            shutil.rmtree(self.state_dir / name, ignore_errors=True)
            (self.state_dir / f"{name}.log").unlink(missing_ok=True)
        (self.state_dir / RECORD).unlink(missing_ok=True)

    def stop(self) -> None:
        """Each node's ``ray start`` (workers first), then the hosts and what runs in them."""
        began = time.monotonic()
        stop_daemons([[d for d in self.daemons if d.name != HEAD],
                      [d for d in self.daemons if d.name == HEAD]], grace_s=30.0)
        self.timings["nodes_stop_s"] = time.monotonic() - began
        if self._fabric is not None:
            self._fabric.close()
        self.daemons, self.hosts, self._fabric = [], {}, None
        _record_path(self.state_dir).unlink(missing_ok=True)
        self._clear()
        self.timings["stop_s"] = time.monotonic() - began


def _record_path(state_dir: Path) -> Path:
    import hashlib

    return RECORDS / f"{hashlib.sha1(str(state_dir).encode()).hexdigest()[:16]}.json"


def stop_recorded(record: dict[str, Any]) -> None:
    """Stop a cluster from its record alone (its owner gone): its nodes, then its hosts."""
    shared.stop_recorded(record, lambda daemons: stop_daemons([daemons], grace_s=30.0),
                         lambda state: [state / RECORD, _record_path(state)])


def sweep() -> list[str]:
    """Remove the clusters whose owner is gone (their hosts, and all that ran in them, go
    through ``fabric.sweep``); returns their state folders."""
    from ...core.lifeline import alive

    fabric.sweep()
    removed = []
    for path in sorted(RECORDS.glob("*.json")) if RECORDS.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            if alive(int(record["owner"]), float(record["started"])):
                continue
        except (OSError, ValueError, KeyError, TypeError):
            pass
        else:
            stop_recorded(record)
            removed.append(str(record.get("state_dir")))
        path.unlink(missing_ok=True)
    return removed


__all__ = ["HEAD", "RECORD", "LocalRay", "LocalRayError", "available", "stop_recorded", "sweep"]
