"""``--dlperf-memory-limit``: a per-rank memory limit the OS enforces. The rank confines itself
(``apply_limit``, before any framework is imported); the launcher reads what the limit did
(``oom_kills``) and removes the rank's cgroup afterwards (``release``). Both sides need the same
files, so the mechanism lives here, below both.

Standard library only: ranks may run under another Python.
"""

from __future__ import annotations

import atexit
import os
import resource
import time
from typing import Any


def limit_file(out_dir: str, rank: int) -> str:
    return os.path.join(out_dir, f"rank-{rank}.memory-limit.json")


def _cgroup_paths() -> dict[str, str]:
    """This process's cgroup per hierarchy: "" for cgroup v2's, else the v1 controllers'."""
    paths = {}
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for name in controllers.split(",") if controllers else [""]:
                    paths[name] = path
    except OSError:
        pass
    return paths


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, filesystem type, super options) of every cgroup mount."""
    found = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                head, _, tail = line.partition(" - ")
                fstype, _, options = (tail.split() + ["", "", ""])[:3]
                if fstype in ("cgroup", "cgroup2"):
                    found.append((head.split()[4], fstype, options.split(",")))
    except OSError:
        pass
    return found


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


# Per cgroup version: how to find the memory hierarchy (filesystem type, the controller's name
# in /proc/self/cgroup, the mount option), the limit file, and the swap file with the value that
# keeps the rank from escaping its limit into swap (None: the same as the limit).
_CGROUPS = {
    "cgroup-v2": ("cgroup2", "", None, "memory.max", ("memory.swap.max", "0")),
    "cgroup-v1": ("cgroup", "memory", "memory", "memory.limit_in_bytes",
                  ("memory.memsw.limit_in_bytes", None)),  # memory + swap, to the same limit
}


def own_cgroups() -> list[tuple[str, str]]:
    """(mechanism, directory) of this process's own cgroup in each hierarchy that could hold a
    memory limit, in the order tried: cgroup v2's, then v1's memory controller's. A rank's
    limited cgroup is made inside the one it started in."""
    own_paths = _cgroup_paths()
    mounts = _mounts()
    found = []
    for mechanism, (fstype, hierarchy, option, *_) in _CGROUPS.items():
        own = own_paths.get(hierarchy)
        for mount, mount_type, options in mounts:
            if mount_type == fstype and own is not None and (not option or option in options):
                found.append((mechanism, os.path.join(mount, own.lstrip("/"))))
    return found


def _join_cgroup(limit: int, name: str) -> dict[str, Any] | None:
    """Move this process into a new memory cgroup ``name`` under its own, limited to ``limit``
    bytes: cgroup v2 where its memory controller is delegated, else v1's memory controller."""
    for mechanism, parent in own_cgroups():
        *_, limit_file_name, (swap_name, swap) = _CGROUPS[mechanism]
        child = os.path.join(parent, name)
        try:
            os.mkdir(child)
        except OSError:
            continue
        try:  # (a v2 group without the memory controller has no limit file: refused here)
            _write(os.path.join(child, limit_file_name), str(limit))
            if os.path.exists(os.path.join(child, swap_name)):
                _write(os.path.join(child, swap_name), swap or str(limit))
            _write(os.path.join(child, "cgroup.procs"), str(os.getpid()))
        except OSError:
            os.rmdir(child)
            continue
        return {"mechanism": mechanism, "path": child, "parent": parent}
    return None


def apply_limit(limit: int, out_dir: str, rank: int, batch_size: int = 0) -> dict[str, Any]:
    """Confine this rank (and the processes it starts) to ``limit`` bytes, before any framework
    is imported: a memory cgroup of its own (v2, else v1's memory controller), whose OOM killer
    ends the rank when it goes over; else an address-space limit (``RLIMIT_AS``), under which
    allocations fail with the framework's out-of-memory error (it counts virtual memory, which
    runtimes reserve generously: a looser proxy). Written to ``limit_file`` first, so the
    pytest side can tell an OOM kill from a crash."""
    name = f"pytest-dlperf-{os.path.basename(os.path.dirname(os.path.abspath(out_dir)))}" \
           f"-rank{rank}-{os.getpid()}"
    applied = _join_cgroup(limit, name)
    if applied is None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        applied = {"mechanism": "rlimit-as"}
    applied.update(limit_bytes=limit, batch_size=batch_size)
    import json

    with open(limit_file(out_dir, rank), "w") as fh:
        json.dump(applied, fh)
    return applied


def oom_kills(applied: dict[str, Any]) -> int:
    """How many processes the limit's cgroup OOM killer ended (0 without a cgroup)."""
    path = applied.get("path")
    if not path:
        return 0
    name = "memory.events" if applied.get("mechanism") == "cgroup-v2" else "memory.oom_control"
    try:
        with open(os.path.join(path, name)) as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


# Rank cgroups not yet removable: removed at the next release, or when this process exits.
_PENDING: list[str] = []


def release(applied: dict[str, Any]) -> None:
    """Remove the rank's cgroup once its processes were ended. A process killed a moment ago
    can still be listed in it (cgroup v1 keeps it there until it is reaped, which for a rank is
    init's job once its parent is gone), and until then the directory cannot be removed: such
    a cgroup is retried at the next release and, waiting for it a few seconds at most, when
    this (the pytest) process exits."""
    _PENDING[:] = [path for path in _PENDING if not _removed(path)]
    path = applied.get("path")
    if path and not _removed(path):
        _PENDING.append(path)


def _removed(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY: a process is still in it
        return False
    return True


def _release_pending(timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        _PENDING[:] = [path for path in _PENDING if not _removed(path)]
        if not _PENDING or time.monotonic() > deadline:
            return
        time.sleep(0.05)


atexit.register(_release_pending)
