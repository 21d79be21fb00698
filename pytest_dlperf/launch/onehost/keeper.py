"""``dlperf slurm`` and ``dlperf ray``: a local cluster (``slurm.cluster``, ``ray.cluster``) that
outlives the command starting it, whatever its kind (``Kind``: how to make one, find a running
one from its record, say how to use it, run a client on it).

``start`` runs a keeper in the background (``dlperf KIND serve``, a session of its own): it
starts the cluster, says "ready", and holds it (it owns the cluster's record: a keeper that dies
without stopping, SIGKILLed, leaves a cluster the next start sweeps away) until SIGTERM, SIGINT
or SIGHUP, when it stops it. ``stop`` signals the keeper and waits; where the keeper is gone it
stops what the record lists itself. ``run`` executes a client command on the cluster's login
host (Slurm's controller, Ray's head).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .daemons import Daemon

_STOP_WAIT_S = 60.0
_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


@dataclass(frozen=True)
class Kind:
    """One kind of local cluster, as the keeper drives it."""

    name: str  # dlperf NAME
    what: str  # "local Slurm cluster", for messages
    record_file: str  # the record's name in the state folder
    make: Callable[[int, Path], Any]  # a cluster with start() and stop()
    attach: Callable[[Path, dict[str, Any]], Any]  # the running one, from its record
    error: type[Exception]  # what starting one raises
    usage: Callable[[Any], str]  # how to use a running one
    stop_recorded: Callable[[dict[str, Any]], None]  # stop one from its record alone
    status: Callable[[Any], list[str]]  # lines on what runs
    client: Callable[[Any, list[str]], tuple[list[str], dict[str, str]]]  # command, env


def record(kind: Kind, state: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state / kind.record_file).read_text())
    except (OSError, ValueError):
        return None
    return data


def attach(kind: Kind, state: Path) -> Any:
    """The running cluster at ``state``, to run clients on (not to stop: its keeper owns it)."""
    found = record(kind, state)
    if found is None:
        raise kind.error(f"no {kind.what} at {state} (no {kind.record_file}): start one with "
                         f"`dlperf {kind.name} start N --state {state}`")
    return kind.attach(state, found)


class _Stop(Exception):
    pass


_signalled: list[int] = []


def _stop_signal(signum: int, frame: object) -> None:
    """The first signal ends the wait (or the start); later ones do not cut the stop short."""
    if not _signalled:
        _signalled.append(signum)
        raise _Stop(f"signal {signum}")


def serve(kind: Kind, nodes: int, state: Path) -> int:
    """The keeper: start, say "ready" (or the error) on stdout, hold until signalled, stop.
    (Handlers, not a blocked mask: the daemons it starts would inherit the mask.)"""
    for sig in _SIGNALS:
        signal.signal(sig, _stop_signal)
    cluster = kind.make(nodes, state)
    try:
        cluster.start()  # a signal meanwhile: start() stops what it made
    except (kind.error, _Stop) as exc:
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


def start(kind: Kind, nodes: int, state: Path) -> int:
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "keeper.log", "wb") as log:
        keeper = subprocess.Popen(
            [sys.executable, "-m", "pytest_dlperf", kind.name, "serve", str(nodes), "--state",
             str(state)], stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
            text=True, start_new_session=True)
    assert keeper.stdout is not None
    began = time.monotonic()
    said = keeper.stdout.readline().strip()
    if said != "ready":
        rest = keeper.stdout.read() if keeper.wait(timeout=120) is not None else ""
        print(f"dlperf {kind.name}: the cluster did not start: {said}\n{rest}".rstrip()
              + f"\n(the keeper's own log: {state / 'keeper.log'})", file=sys.stderr)
        return 1
    print(f"started in {time.monotonic() - began:.1f} s (keeper pid {keeper.pid})")
    print(kind.usage(attach(kind, state)))
    return 0


def stop(kind: Kind, state: Path) -> int:
    found = record(kind, state)
    if found is None:
        print(f"dlperf {kind.name}: no cluster at {state} (nothing to stop)", file=sys.stderr)
        return 1
    began = time.monotonic()
    owner = Daemon("keeper", int(found["owner"]), float(found["started"]))
    if owner.alive():
        os.kill(owner.pid, signal.SIGTERM)
        while owner.alive() and time.monotonic() - began < _STOP_WAIT_S:
            time.sleep(0.05)
    if owner.alive() or (state / kind.record_file).exists():  # the keeper is gone or stuck
        kind.stop_recorded(found)
    print(f"stopped the cluster at {state} in {time.monotonic() - began:.1f} s")
    return 0


def status(kind: Kind, state: Path) -> int:
    try:
        cluster = attach(kind, state)
    except kind.error as exc:
        print(f"dlperf {kind.name}: {exc}", file=sys.stderr)
        return 1
    for daemon in cluster.daemons:
        print(f"{daemon.name:16} pid {daemon.pid:<8} {'running' if daemon.alive() else 'GONE'}")
    print("\n".join(kind.status(cluster)))
    print(kind.usage(cluster))
    return 0


def run(kind: Kind, state: Path, command: list[str]) -> int:
    """``command`` on the cluster's login host, in place of this process."""
    try:
        cluster = attach(kind, state)
    except kind.error as exc:
        print(f"dlperf {kind.name}: {exc}", file=sys.stderr)
        return 1
    if not command:
        print(f"dlperf {kind.name} run: no command (dlperf {kind.name} run -- hostname)",
              file=sys.stderr)
        return 2
    wrapped, env = kind.client(cluster, command)
    os.execvpe(wrapped[0], wrapped, env)
