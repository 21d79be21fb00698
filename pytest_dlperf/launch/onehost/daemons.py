"""Daemons known by their pid (a local Slurm cluster's munged, slurmctld and slurmd): started
until their pid file appears, stopped by pid (SIGTERM, a wait, SIGKILL), and the processes of a
network namespace. A daemon is its pid *and* its start time: a later process that reuses the
number is never signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

_PID_FILE_S = 30.0


class DaemonError(RuntimeError):
    pass


@dataclass(frozen=True)
class Daemon:
    name: str
    pid: int
    started: float  # the process's create time

    def alive(self) -> bool:
        from ...core.lifeline import alive

        return alive(self.pid, self.started) and not _zombie(self.pid)


def start_daemon(name: str, command: list[str], pid_file: Path, log: Path) -> Daemon:
    """Run ``command``, a daemon that forks into the background and writes ``pid_file``; what
    it prints before that goes to ``log``. Raises ``DaemonError`` if it fails or writes no pid."""
    import psutil

    pid_file.unlink(missing_ok=True)
    with open(log, "wb") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=60)
    deadline = time.monotonic() + _PID_FILE_S
    while done.returncode == 0 and read_pid(pid_file) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = read_pid(pid_file)
    if done.returncode != 0 or pid is None:
        raise DaemonError(f"{name} did not start (exit status {done.returncode}"
                          + ("" if done.returncode else f", no pid in {pid_file}") + ")")
    try:
        return Daemon(name, pid, psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        raise DaemonError(f"{name} wrote its pid ({pid}) and ended at once") from None


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def stop_daemons(groups: list[list[Daemon]], grace_s: float = 10.0) -> list[str]:
    """Each group in turn: SIGTERM to its daemons still running, SIGKILL to those left after
    ``grace_s``. Returns the names of those that needed SIGKILL."""
    killed: list[str] = []
    for group in groups:
        running = [d for d in group if d.alive()]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for daemon in running:
                try:
                    os.kill(daemon.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while running and time.monotonic() < deadline:
                time.sleep(0.02)
                running = [d for d in running if d.alive()]
            if not running:
                break
            if sig == signal.SIGTERM:
                killed += [d.name for d in running]
    return killed


def _zombie(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def namespace_pids(namespace: str) -> list[int]:
    """The processes in network namespace ``namespace`` (``ip netns pids``)."""
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split() if pid.isdigit()]


def kill_now(pids: list[int], timeout_s: float = 10.0) -> None:
    """SIGKILL to every one of ``pids``, and wait until they are gone."""
    import psutil

    victims = []
    for pid in pids:
        try:
            victim = psutil.Process(pid)
            victim.kill()
            victims.append(victim)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=timeout_s)
