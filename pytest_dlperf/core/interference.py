"""What else ran on this host while a launch measured: other processes' CPU time and the
hypervisor's steal from ``/proc/stat``, and on CUDA the other processes on the GPUs.

A launch is watched from its start to its end (``Watch``); ``between`` turns the two samples into
fractions of the machine. The CPU time of this process's own tree (pytest, its threads, the
ranks it started, live or ended) is subtracted from the machine's busy time: what is left was
used by processes that are not ours. Two launches may run at once in threads of one pytest
(A/B's duet): both are our tree, so neither counts as the other's interference.

Standard library only: Linux's ``/proc``; elsewhere nothing is measured (the fractions are
None) and nothing is judged on it.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROC = Path("/proc")
# /proc/stat's aggregate cpu line, in this order (the later guest fields are inside user/nice).
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")
TICKS = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
# How often a launch's process tree is read: a rank's last moments before it is killed are
# missed by at most this (a scan of our tree took well under a millisecond here).
POLL_S = 0.1


@dataclass(frozen=True)
class CpuTimes:
    """The machine's CPU time since boot, in seconds, summed over every CPU; ``cores``: the
    CPUs /proc/stat lists."""

    busy_s: float
    steal_s: float
    cores: int


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic()
    cpu: CpuTimes | None  # None: no /proc/stat here
    own_s: float  # CPU seconds of this process's tree so far (``Watch``)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_mib: float

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "used_memory_mib": self.used_memory_mib}


@dataclass(frozen=True)
class Interference:
    """What one launch ran beside. ``others_cpu``: the share of the machine's CPU time (wall x
    cores) used by processes outside this pytest's tree; ``steal``: the share the hypervisor
    gave other guests; ``own_cpu``: our tree's share (pytest, the ranks). None: not measured
    (no /proc). ``gpu_processes``: other processes on the GPUs at the launch's start or end."""

    wall_s: float
    cores: int
    others_cpu: float | None
    steal: float | None
    own_cpu: float | None
    gpu_processes: tuple[GpuProcess, ...] = field(default_factory=tuple)
    retries: int = 0  # launches before this one discarded for running beside interference

    @property
    def share(self) -> float | None:
        """The machine others took from this launch: their CPU time and the steal."""
        if self.others_cpu is None:
            return None
        return min(1.0, self.others_cpu + (self.steal or 0.0))

    def to_json(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "cores": self.cores, "others_cpu": self.others_cpu,
                "steal": self.steal, "own_cpu": self.own_cpu, "retries": self.retries,
                "gpu_processes": [p.to_json() for p in self.gpu_processes]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Interference:
        return cls(float(data["wall_s"]), int(data["cores"]), data.get("others_cpu"),
                   data.get("steal"), data.get("own_cpu"),
                   tuple(GpuProcess(int(p["pid"]), float(p["used_memory_mib"]))
                         for p in data.get("gpu_processes", [])),
                   int(data.get("retries", 0)))


def parse_cpu_line(text: str, ticks_per_s: float) -> CpuTimes:
    """/proc/stat's aggregate ``cpu`` line (and its ``cpuN`` lines, counted as cores)."""
    lines = text.splitlines()
    first = next(line for line in lines if line.split()[0] == "cpu")
    values = dict(zip(CPU_FIELDS, (int(v) for v in first.split()[1:])))
    cores = sum(1 for line in lines if line.startswith("cpu") and line.split()[0] != "cpu")
    return CpuTimes(sum(values.get(name, 0) for name in BUSY_FIELDS) / ticks_per_s,
                    values.get("steal", 0) / ticks_per_s, max(cores, 1))


def _proc_stat(pid: int) -> tuple[int, tuple[int, int], float] | None:
    """A process's parent, its identity (pid and start time: pids are reused) and its own
    utime+stime in ticks (not its reaped children's), or None (gone)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()  # the name in parentheses may hold spaces
    return int(rest[1]), (pid, int(rest[19])), float(int(rest[11]) + int(rest[12]))


def _children(pid: int) -> list[int]:
    """``pid``'s children, from its threads' ``children`` files."""
    found: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return []
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(root: int) -> dict[tuple[int, int], float]:
    """Every live (or not yet reaped) descendant of ``root`` and its own CPU ticks, keyed by
    pid and start time. From the children files where the kernel has them (only our tree is
    read), else by parent chains over all of /proc."""
    if not (PROC / str(root) / "task" / str(root) / "children").exists():
        return _descendants_by_scan(root)
    tree: dict[tuple[int, int], float] = {}
    todo = [root]
    while todo:
        for pid in _children(todo.pop()):
            found = _proc_stat(pid)
            if found is not None and found[1] not in tree:
                tree[found[1]] = found[2]
                todo.append(pid)
    return tree


def _descendants_by_scan(root: int) -> dict[tuple[int, int], float]:
    table = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            found = _proc_stat(int(entry.name))
            if found is not None:
                table[found[1]] = found
    children: dict[int, list[tuple[int, int]]] = {}
    for key, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(key)
    tree, todo = {}, list(children.get(root, []))
    while todo:
        key = todo.pop()
        if key not in tree:
            tree[key] = table[key][2]
            todo += children.get(key[0], [])
    return tree


# Processes outside this process's tree whose work is ours: a Ray cluster's actors on this
# host, which Ray's raylet starts, and the ranks under them (``launch.ray``). Counted with our
# tree while adopted.
_ADOPTED: set[int] = set()


def adopt(pids: list[int]) -> None:
    _ADOPTED.update(pids)


def disown(pids: list[int]) -> None:
    _ADOPTED.difference_update(pids)


def our_tree(root: int) -> dict[tuple[int, int], float]:
    """``descendants(root)``, with every adopted process and its own descendants."""
    tree = descendants(root)
    for pid in list(_ADOPTED):
        found = _proc_stat(pid)
        if found is not None:
            tree[found[1]] = found[2]
            tree.update(descendants(pid))
    return tree


def _self_seconds() -> float:
    mine = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return mine.ru_utime + mine.ru_stime


def _machine() -> CpuTimes | None:
    try:
        return parse_cpu_line((PROC / "stat").read_text(), TICKS)
    except (OSError, StopIteration, ValueError):
        return None


class Watch:
    """Our tree's CPU time through one launch, and the machine's: started at the launch's
    start, ``stop``ped at its end. The tree is polled every ``every_s`` from a thread, each
    descendant's own CPU time kept as last seen: the launcher kills a launch's agents once
    the ranks' results are in, so the ranks die orphaned, reaped by init, and their CPU time
    never reaches this process's ``RUSAGE_CHILDREN`` (it read ~1% of the machine as ours for a
    rank that trained all along). What a process uses after its last poll is missed: at most
    ``every_s`` of a core per process."""

    def __init__(self, every_s: float = POLL_S) -> None:
        self.every_s, self.root = every_s, os.getpid()
        self.first = our_tree(self.root)
        self.last = dict(self.first)
        self.start = Sample(time.monotonic(), _machine(), _self_seconds())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="dlperf-interference",
                                        daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            self.last.update(our_tree(self.root))

    def stop(self, gpu_processes: tuple[GpuProcess, ...] = ()) -> Interference:
        self._stop.set()
        self._thread.join()
        self.last.update(our_tree(self.root))
        tree = sum(ticks - self.first.get(key, 0.0) for key, ticks in self.last.items())
        end = Sample(time.monotonic(), _machine(), _self_seconds() + tree / TICKS)
        return between(self.start, end, gpu_processes)


def between(start: Sample, end: Sample,
            gpu_processes: tuple[GpuProcess, ...] = ()) -> Interference:
    """The interference of the interval from ``start`` to ``end``, as shares of the machine."""
    wall = max(end.at - start.at, 1e-9)
    if start.cpu is None or end.cpu is None:
        return Interference(wall, os.cpu_count() or 1, None, None, None, gpu_processes)
    cores = end.cpu.cores
    capacity = wall * cores
    own = end.own_s - start.own_s
    busy = end.cpu.busy_s - start.cpu.busy_s
    steal = end.cpu.steal_s - start.cpu.steal_s

    def clamp(value: float) -> float:
        return min(1.0, max(0.0, value))

    return Interference(wall, cores, clamp((busy - own) / capacity), clamp(steal / capacity),
                        clamp(own / capacity), gpu_processes)


def parse_compute_apps(text: str, ours: set[int]) -> tuple[GpuProcess, ...]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader`` output, less
    the processes of ``ours``: "1234, 5000 MiB" per line ("[N/A]" memory reads as 0)."""
    found = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        pid = int(parts[0])
        if pid in ours:
            continue
        number = parts[1].split()[0] if parts[1] else ""
        try:
            memory = float(number)
        except ValueError:
            memory = 0.0
        found.append(GpuProcess(pid, memory))
    return tuple(found)


def merge(first: tuple[GpuProcess, ...],
          second: tuple[GpuProcess, ...]) -> tuple[GpuProcess, ...]:
    """The processes seen at a launch's start or end, each once with its larger memory."""
    seen: dict[int, GpuProcess] = {}
    for process in (*first, *second):
        known = seen.get(process.pid)
        if known is None or process.used_memory_mib > known.used_memory_mib:
            seen[process.pid] = process
    return tuple(seen.values())


def gpu_others() -> tuple[GpuProcess, ...]:
    """Other processes on this host's GPUs now (every GPU nvidia-smi lists; none where it is
    missing or fails: a measurement, never a reason to fail the case)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        done = subprocess.run([smi, "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return ()
    if done.returncode != 0:
        return ()
    ours = {os.getpid(), *(pid for pid, _ in descendants(os.getpid()))}
    return parse_compute_apps(done.stdout, ours)
