"""``dlperf slurm``: a local Slurm cluster (``localslurm``) that outlives the command starting it.

``start`` runs a keeper in the background (``dlperf slurm serve``, a session of its own): it
starts the cluster, says "ready", and holds it (it owns the cluster's record: a keeper that dies
without stopping, SIGKILLed, leaves a cluster the next start sweeps away) until SIGTERM, SIGINT
or SIGHUP, when it stops it. ``stop`` signals the keeper and waits; where the keeper is gone it
stops what the record lists itself. ``run`` executes a client command on the controller's host
(the cluster's login node).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .daemons import Daemon
from .fabric import Host
from .localslurm import RECORD, LocalSlurm, LocalSlurmError, stop_recorded

DEFAULT_STATE = Path("/tmp/dlperf-slurm")
_STOP_WAIT_S = 60.0
_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _record(state: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return data


def attach(state: Path) -> LocalSlurm:
    """The running cluster at ``state``, to run clients on (not to stop: its keeper owns it)."""
    record = _record(state)
    if record is None:
        raise LocalSlurmError(f"no local Slurm cluster at {state} (no {RECORD}): start one with "
                              f"`dlperf slurm start N --state {state}`")
    cluster = LocalSlurm(state, nodes=sum(1 for name in record["hosts"] if name != "ctl"))
    cluster.hosts = {name: Host(**host) for name, host in record["hosts"].items()}
    cluster.daemons = [Daemon(**daemon) for daemon in record["daemons"]]
    return cluster


def usage(cluster: LocalSlurm) -> str:
    state = "" if cluster.state_dir == DEFAULT_STATE else f" --state {cluster.state_dir}"
    hosts = ", ".join(f"{name} {host.address}" for name, host in cluster.hosts.items())
    return "\n".join([
        f"A Slurm cluster of {cluster.nodes} node(s) on this machine, each its own network host "
        f"({hosts}); state in {cluster.state_dir}.",
        "Clients run on its controller's host (ctl, the login node), e.g.:",
        f"  dlperf slurm run{state} -- sinfo",
        f"  dlperf slurm run{state} -- salloc -N {cluster.nodes} pytest perf_tests -m multinode "
        f"--nodes {cluster.nodes}",
        f"  dlperf slurm run{state} -- sbatch -N {cluster.nodes} --wait --wrap 'pytest ...'",
        f"  (or yourself: {shlex.join(cluster.client(['CMD']))})",
        f"Stop it: dlperf slurm stop{state}",
    ])


class _Stop(Exception):
    pass


_signalled: list[int] = []


def _stop_signal(signum: int, frame: object) -> None:
    """The first signal ends the wait (or the start); later ones do not cut the stop short."""
    if not _signalled:
        _signalled.append(signum)
        raise _Stop(f"signal {signum}")


def serve(nodes: int, state: Path) -> int:
    """The keeper: start, say "ready" (or the error) on stdout, hold until signalled, stop.
    (Handlers, not a blocked mask: the daemons it starts would inherit the mask.)"""
    for sig in _SIGNALS:
        signal.signal(sig, _stop_signal)
    cluster = LocalSlurm(state, nodes=nodes)
    try:
        cluster.start()  # a signal meanwhile: start() stops what it made
    except (LocalSlurmError, _Stop) as exc:
        print(f"error: {exc}", flush=True)
        return 1
    print("ready", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the starting command stops reading
    try:
        while True:
            signal.pause()
    except _Stop:
        pass
    finally:
        cluster.stop()
    return 0


def start(nodes: int, state: Path) -> int:
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "keeper.log", "wb") as log:
        keeper = subprocess.Popen(
            [sys.executable, "-m", "pytest_dlperf", "slurm", "serve", str(nodes), "--state",
             str(state)], stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
            text=True, start_new_session=True)
    assert keeper.stdout is not None
    began = time.monotonic()
    said = keeper.stdout.readline().strip()
    if said != "ready":
        rest = keeper.stdout.read() if keeper.wait(timeout=120) is not None else ""
        print(f"dlperf slurm: the cluster did not start: {said}\n{rest}".rstrip()
              + f"\n(the keeper's own log: {state / 'keeper.log'})", file=sys.stderr)
        return 1
    print(f"started in {time.monotonic() - began:.1f} s (keeper pid {keeper.pid})")
    print(usage(attach(state)))
    return 0


def stop(state: Path) -> int:
    record = _record(state)
    if record is None:
        print(f"dlperf slurm: no cluster at {state} (nothing to stop)", file=sys.stderr)
        return 1
    began = time.monotonic()
    owner = Daemon("keeper", int(record["owner"]), float(record["started"]))
    if owner.alive():
        os.kill(owner.pid, signal.SIGTERM)
        while owner.alive() and time.monotonic() - began < _STOP_WAIT_S:
            time.sleep(0.05)
    if owner.alive() or (state / RECORD).exists():  # the keeper is gone or stuck: by the record
        stop_recorded(record)
    print(f"stopped the cluster at {state} in {time.monotonic() - began:.1f} s")
    return 0


def status(state: Path) -> int:
    try:
        cluster = attach(state)
    except LocalSlurmError as exc:
        print(f"dlperf slurm: {exc}", file=sys.stderr)
        return 1
    for daemon in cluster.daemons:
        print(f"{daemon.name:16} pid {daemon.pid:<8} {'running' if daemon.alive() else 'GONE'}")
    print(f"sinfo: {cluster.sinfo() or 'no answer from slurmctld'}")
    print(usage(cluster))
    return 0


def run(state: Path, command: list[str]) -> int:
    """``command`` on the controller's host, in place of this process."""
    try:
        cluster = attach(state)
    except LocalSlurmError as exc:
        print(f"dlperf slurm: {exc}", file=sys.stderr)
        return 1
    if not command:
        print("dlperf slurm run: no command (dlperf slurm run -- sinfo)", file=sys.stderr)
        return 2
    wrapped = cluster.client(command)
    os.execvpe(wrapped[0], wrapped, cluster.environment())
