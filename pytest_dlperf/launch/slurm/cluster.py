"""A real Slurm cluster on this one machine: munged, one slurmctld and N slurmd, each node its
own network host (a ``fabric`` namespace with its own address) with its own host name.

Every node, and the controller (``ctl``, where clients run: the cluster's login node), runs in
a network namespace of the fabric, and in UTS and mount namespaces of its own where
``hostname`` is the node's name and a private ``/etc/hosts`` maps every node's name to its
address, as on a real cluster (torchrun's agents advertise ``socket.getfqdn()``, TensorFlow's
workers bind ``socket.gethostname()``, gloo picks the interface the host name resolves to).
``nsenter --net`` enters the fabric's namespace (``ip netns exec`` would remount /sys, and
slurmd then finds no cgroup filesystem); ``unshare --uts --mount`` makes the other two.

Everything of one cluster is under one folder (``state_dir``): munge's key, socket and pid,
slurm.conf, the hosts file, Slurm's state, spool, pid and log files, and ``cluster.json``, the
record of the daemons (pid and start time) and of the fabric. The same record under
``RECORDS`` lets the next ``start`` stop a cluster whose owner died (pytest SIGKILLed): its
daemons by pid, its namespaces through ``fabric.sweep``. Each daemon is stopped by its pid
(SIGTERM, a wait, SIGKILL), and whatever still runs in a node's namespace (a job's
slurmstepd and tasks) ends with the namespace.

Needs root, ``ip``/``nsenter``/``unshare``, Slurm and munge (Debian: ``apt-get install slurmd
slurmctld slurm-client munge``): ``available()`` says what is missing.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..onehost import cluster as shared
from ..onehost import fabric
from ..onehost.cluster import LocalCluster
from ..onehost.daemons import (
    Daemon,
    DaemonError,
    kill_now,
    namespace_pids,
    start_daemon,
    stop_daemons,
)
from .conf import CONTROLLER, hosts_text, slurm_conf

RECORDS = Path("/run/pytest-dlperf/slurm")
RECORD = "cluster.json"
_TOOLS = ("slurmd", "slurmctld", "srun", "sinfo", "munged", "runuser", "unshare", "nsenter",
          "mount", "hostname")
# A Unix socket's path has at most 107 bytes; slurmd's step sockets sit in the spool folder.
_MAX_STATE_PATH = 60
_READY_S = 60.0
# Runs inside a node's new UTS and mount namespaces: its name, its /etc/hosts, then the command.
_AS_NODE = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'


class LocalSlurmError(RuntimeError):
    pass


def available() -> tuple[bool, str]:
    """Whether this process can start a local cluster, and if not, why."""
    ok, why = fabric.available()
    if not ok:
        return False, why
    missing = [tool for tool in _TOOLS if not shutil.which(tool)]
    if missing:
        return False, (f"{', '.join(missing)} not found (Debian: apt-get install slurmd "
                       "slurmctld slurm-client munge)")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return False, "no user 'munge' to run munged as (Debian's munge package makes it)"
    return True, ""


@dataclass
class LocalSlurm(LocalCluster):
    """``nodes`` Slurm nodes (node1, node2, ...) of ``cpus`` CPUs each, and their controller.
    ``start()``/``stop()`` or a ``with`` block; ``client(cmd)`` runs a Slurm client (srun,
    sbatch, salloc, sinfo, scancel, ...) on the controller's host."""

    cpus: int = 8
    error: ClassVar[type[Exception]] = LocalSlurmError

    @property
    def conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def hosts_file(self) -> Path:
        return self.state_dir / "hosts"

    @property
    def munge_socket(self) -> Path:
        return self.state_dir / "munge" / "munge.socket"

    # -- clients --------------------------------------------------------------------------

    def on(self, name: str, command: list[str]) -> list[str]:
        """``command``, run on host ``name`` (``ctl`` or a node): in its network namespace,
        with its host name and its /etc/hosts."""
        host = self.hosts.get(name)
        if host is None:
            raise LocalSlurmError(f"no host {name!r} in this cluster (hosts: "
                                  f"{', '.join(self.hosts) or 'none: not started'})")
        return host.command(["unshare", "--uts", "--mount", "--propagation", "private", "--",
                             "sh", "-c", _AS_NODE, "sh", name, str(self.hosts_file), *command])

    def client(self, command: list[str]) -> list[str]:
        """``command`` (a Slurm client, or what runs one: pytest under salloc) on the
        controller's host, with ``SLURM_CONF`` set."""
        return self.on(CONTROLLER, ["env", f"SLURM_CONF={self.conf}", *command])

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default this process's environment) for a client: ``SLURM_CONF`` set, and
        no ``SLURM_*`` of an allocation this process may itself be in."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def sinfo(self) -> dict[str, str]:
        """Each node's state as sinfo says (``idle``, ``alloc``, ``down*``, ...)."""
        done = subprocess.run(self.client(["sinfo", "-h", "-N", "-o", "%N %T"]),
                              capture_output=True, text=True, timeout=30,
                              env=self.environment())
        return dict(line.split()[:2] for line in done.stdout.splitlines() if len(line.split()) > 1)

    def busy(self) -> dict[str, list[int]]:
        """Per host, what runs in its namespace besides the cluster's daemons (and
        slurmctld's own helper): jobs' steps and tasks, clients. Empty when all is quiet."""
        import psutil

        ours = {d.pid for d in self.daemons}
        controller = {d.pid for d in self.daemons if d.name == "slurmctld"}
        found = {}
        for name, host in self.hosts.items():
            extra = []
            for pid in namespace_pids(host.namespace):
                try:
                    if pid not in ours and psutil.Process(pid).ppid() not in controller:
                        extra.append(pid)
                except psutil.NoSuchProcess:
                    continue
            if extra:
                found[name] = extra
        return found

    def crash(self, node: str) -> None:
        """The node dies at once: SIGKILL to everything on it (slurmd, its steps, their
        tasks); its address stays, so peers see their connections reset."""
        kill_now(namespace_pids(self.hosts[node].namespace))

    def restart(self, node: str) -> None:
        """slurmd of ``node`` again (after ``crash``), until sinfo shows every node idle."""
        self.daemons = [d for d in self.daemons if d.name != f"slurmd-{node}"]
        self._start_daemon(f"slurmd-{node}", node, ["slurmd", "-N", node, "-f", str(self.conf)],
                           self.state_dir / "run" / f"slurmd-{node}.pid")
        self._wait_ready()

    # -- starting -------------------------------------------------------------------------

    def start(self) -> None:
        ok, why = available()
        if not ok:
            raise LocalSlurmError(f"cannot start a local Slurm cluster: {why}")
        sweep()
        self._prepare_folder()
        began = time.monotonic()
        try:
            self._build_hosts()
            self.timings["fabric_s"] = time.monotonic() - began
            self._write_files()
            self._start_munge()
            self._start_daemon("slurmctld", CONTROLLER, ["slurmctld", "-c", "-f", str(self.conf)],
                               self.state_dir / "run" / "slurmctld.pid")
            for name in self.node_names:
                (self.state_dir / "spool" / name).mkdir(parents=True, exist_ok=True)
                self._start_daemon(f"slurmd-{name}", name,
                                   ["slurmd", "-N", name, "-f", str(self.conf)],
                                   self.state_dir / "run" / f"slurmd-{name}.pid")
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.timings["start_s"] = time.monotonic() - began

    def _prepare_folder(self) -> None:
        if len(str(self.state_dir)) > _MAX_STATE_PATH:
            raise LocalSlurmError(
                f"{self.state_dir}: the state folder's path is {len(str(self.state_dir))} "
                f"characters; Unix sockets live in it (at most 107 bytes a path): pick one of "
                f"at most {_MAX_STATE_PATH}, e.g. under /tmp")
        if (self.state_dir / RECORD).exists() and _record_alive(self.state_dir / RECORD):
            raise LocalSlurmError(f"{self.state_dir} holds a running cluster already: stop it "
                                  "first (dlperf slurm stop --state ...)")
        for ancestor in self.state_dir.parents:
            if ancestor.exists() and not ancestor.stat().st_mode & 0o001:
                raise LocalSlurmError(
                    f"munged runs as user munge and cannot reach {self.state_dir}: {ancestor} "
                    f"is not searchable by others (mode {ancestor.stat().st_mode & 0o777:o}); "
                    "pick a state folder elsewhere (under /tmp), or chmod o+x it")
        for sub in ("state", "spool", "run", "log"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
            (self.state_dir / sub).mkdir(parents=True)
        self.state_dir.chmod(0o755)

    def _build_hosts(self) -> None:
        self._fabric = fabric.Fabric()
        for name in [CONTROLLER, *self.node_names]:
            self.hosts[name] = self._fabric.add_host(name)
        self._save()

    def _write_files(self) -> None:
        addresses = {name: host.address for name, host in self.hosts.items()}
        self.hosts_file.write_text(hosts_text(addresses))
        self.conf.write_text(slurm_conf(self.state_dir, addresses, self.node_names, self.cpus,
                                        cluster=f"dlpf{self._fabric.tag if self._fabric else ''}"))

    def _start_munge(self) -> None:
        folder = self.state_dir / "munge"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        munge = pwd.getpwnam("munge")
        key = folder / "munge.key"
        key.write_bytes(secrets.token_bytes(128))
        for path, mode in ((folder, 0o755), (key, 0o400)):
            os.chown(path, munge.pw_uid, munge.pw_gid)
            path.chmod(mode)
        # On ctl's host: if cut short before its pid is recorded, the fabric's sweep ends it.
        self._start_daemon("munged", CONTROLLER, [
            "runuser", "-u", "munge", "--", "munged", f"--socket={self.munge_socket}",
            f"--key-file={key}", f"--pid-file={folder / 'munged.pid'}",
            f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}"],
            folder / "munged.pid")

    def _start_daemon(self, name: str, host: str | None, command: list[str],
                      pid_file: Path) -> None:
        """Start a daemon on ``host`` (None: this machine's own namespaces), and record it."""
        began = time.monotonic()
        try:
            daemon = start_daemon(name, command if host is None else self.on(host, command),
                                  pid_file, self.state_dir / "log" / f"{name}.start.log")
        except DaemonError as exc:
            raise LocalSlurmError(f"{exc}:\n{self._logs(name)}") from None
        self.daemons.append(daemon)
        self._save()
        self.timings[f"{name}_s"] = time.monotonic() - began

    def _wait_ready(self) -> None:
        """Until sinfo shows every node idle."""
        began = time.monotonic()
        states: dict[str, str] = {}
        while time.monotonic() - began < _READY_S:
            states = self.sinfo()
            if all(states.get(name) == "idle" for name in self.node_names):
                self.timings["nodes_idle_s"] = time.monotonic() - began
                return
            time.sleep(0.1)
        raise LocalSlurmError(f"the nodes were not idle after {_READY_S:g} s (sinfo: {states}):\n"
                              + self._logs())

    def _logs(self, name: str | None = None, lines: int = 15) -> str:
        """The tails of the daemons' logs (``name``'s alone, when given)."""
        found = sorted((self.state_dir / "log").glob("*.log")) + [
            self.state_dir / "munge" / "munged.log"]
        parts = []
        for path in found:
            if path.exists() and (name is None or path.name.startswith(name)):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} ---\n" + "\n".join(tail))
        return "\n".join(parts)

    # -- the record -----------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        import psutil

        me = psutil.Process()
        return {"schema": 1, "owner": me.pid, "started": me.create_time(),
                "state_dir": str(self.state_dir), "conf": str(self.conf),
                "fabric": self._fabric.tag if self._fabric else None,
                "hosts": {name: asdict(host) for name, host in self.hosts.items()},
                "daemons": [asdict(d) for d in self.daemons]}

    def _save(self) -> None:
        data = json.dumps(self.record(), sort_keys=True, indent=1) + "\n"
        RECORDS.mkdir(parents=True, exist_ok=True)
        for path in (self.state_dir / RECORD, _record_path(self.state_dir)):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(data)
            os.replace(tmp, path)

    # -- stopping -------------------------------------------------------------------------

    def stop(self) -> None:
        """Every daemon by its pid, then the hosts (and what still runs on them)."""
        began = time.monotonic()
        _stop(self.daemons)
        self.timings["daemons_stop_s"] = time.monotonic() - began
        if self._fabric is not None:
            self._fabric.close()
        self.daemons, self.hosts, self._fabric = [], {}, None
        (self.state_dir / RECORD).unlink(missing_ok=True)
        _record_path(self.state_dir).unlink(missing_ok=True)
        self.timings["stop_s"] = time.monotonic() - began


def _record_path(state_dir: Path) -> Path:
    """The cluster's record under RECORDS: one name per state folder."""
    import hashlib

    return RECORDS / f"{hashlib.sha1(str(state_dir).encode()).hexdigest()[:16]}.json"


def _record_alive(path: Path) -> bool:
    from ...core.lifeline import alive

    try:
        record = json.loads(path.read_text())
        return alive(int(record["owner"]), float(record["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _stop(daemons: list[Daemon]) -> None:
    """The Slurm daemons, then munged (they talk to it as they end)."""
    stop_daemons([[d for d in daemons if d.name != "munged"],
                  [d for d in daemons if d.name == "munged"]])


def stop_recorded(record: dict[str, Any]) -> None:
    """Stop a cluster from its record alone (its owner gone): daemons, then its fabric."""
    shared.stop_recorded(record, _stop, lambda state: [state / RECORD, _record_path(state)])


def sweep() -> list[str]:
    """Stop the clusters whose owner is gone; returns their state folders."""
    stopped = []
    for path in sorted(RECORDS.glob("*.json")) if RECORDS.is_dir() else []:
        if _record_alive(path):
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        stop_recorded(record)
        path.unlink(missing_ok=True)
        stopped.append(str(record.get("state_dir")))
    fabric.sweep()
    return stopped


def processes(state_dir: Path) -> list[str]:
    """The processes whose command line names the cluster's folder (``state_dir``): its
    daemons, and clients started through ``client``. Empty once it is stopped (its namespaces,
    and what ran in them, are ``fabric.leftovers``' to tell)."""
    import psutil

    state = str(Path(state_dir).absolute())
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if state in cmdline and proc.info["pid"] != os.getpid():
            found.append(f"{proc.info['pid']} {cmdline}")
    return found


__all__ = ["LocalSlurm", "LocalSlurmError", "available", "processes", "stop_recorded", "sweep"]
