"""Memory on the worker side: a rank's peak memory over a timed window, and what an
out-of-memory error looks like in each framework.

Runs in every training rank: standard library only (ranks may run under another Python).

- **CPU**: the rank's peak resident set size. Linux keeps a resettable high-water mark per
  process: writing ``5`` to ``/proc/self/clear_refs`` sets ``VmHWM`` (``/proc/self/status``)
  back to the current RSS, so the peak of one window is read without sampling. Where that file
  cannot be written, the figure is the process's lifetime peak (``getrusage``), and says so.
- **CUDA**: the framework's own peak counters (``Trainer.peak_memory``, reset before each
  window by ``Trainer.reset_peak_memory``), and NVML's used memory of this process, which
  counts what no framework counter sees (the CUDA context, cuDNN/cuBLAS workspaces, NCCL
  buffers) and is the same figure for every framework. NVML has no peak, only what the process
  holds now: read at the end of a window, after the caching allocators (torch, TensorFlow,
  OneFlow all keep what they once reserved) grew to the window's high-water mark.
"""

from __future__ import annotations

import atexit
import os
import resource
import time
from typing import Any

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


class RssPeak:
    """This process's peak resident memory since the last ``reset``."""

    def __init__(self) -> None:
        self.resettable = self._clear()
        # "window": the peak of each window alone; "process": since the process started.
        self.scope = "window" if self.resettable else "process"

    @staticmethod
    def _clear() -> bool:
        try:
            with open(_CLEAR_REFS, "w") as fh:
                fh.write("5")
            return True
        except OSError:
            return False

    def reset(self) -> None:
        if self.resettable:
            self._clear()

    def peak(self) -> int:
        """Bytes."""
        try:
            with open(_STATUS) as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024  # kB
        except OSError:
            pass
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # kB on Linux


def nvml_used_bytes(local_rank: int, pid: int | None = None) -> int | None:
    """GPU memory that NVML says this process (``pid``) uses on its device, or None where NVML
    cannot tell (no pynvml, no driver, or a container that hides other PID namespaces)."""
    try:
        import pynvml
    except ImportError:
        return None
    pid = os.getpid() if pid is None else pid
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError and its many subclasses
        return None
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        index = local_rank
        if visible and visible not in ("-1", ""):
            ids = [v.strip() for v in visible.split(",")]
            if local_rank < len(ids) and ids[local_rank].isdigit():
                index = int(ids[local_rank])
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        used = None
        for getter in ("nvmlDeviceGetComputeRunningProcesses",
                       "nvmlDeviceGetGraphicsRunningProcesses"):
            for proc in getattr(pynvml, getter)(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    used = (used or 0) + int(proc.usedGpuMemory)
        return used
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


class WindowMemory:
    """One rank's memory over each timed window: reset before it, read after it (both outside
    the timed region). ``trainer`` may offer ``reset_peak_memory()`` and ``peak_memory()``
    (a dict of the framework's own counters, bytes)."""

    def __init__(self, trainer: Any, cuda: bool, local_rank: int) -> None:
        self.trainer, self.cuda, self.local_rank = trainer, cuda, local_rank
        self.rss = RssPeak()
        self.windows: list[dict[str, Any]] = []

    def before_window(self) -> None:
        self.rss.reset()
        reset = getattr(self.trainer, "reset_peak_memory", None)
        if self.cuda and reset is not None:
            reset()

    def after_window(self) -> None:
        entry: dict[str, Any] = {"host_rss_bytes": self.rss.peak()}
        if self.cuda:
            counters = getattr(self.trainer, "peak_memory", None)
            entry.update(counters() if counters is not None else {})
            used = nvml_used_bytes(self.local_rank)
            if used is not None:
                entry["nvml_used_bytes"] = used
        entry["peak_bytes"] = judged(entry, self.cuda)
        self.windows.append(entry)

    def to_json(self) -> dict[str, Any]:
        return {"windows": self.windows, "device": "cuda" if self.cuda else "cpu",
                "rss_scope": self.rss.scope,
                "source": source(self.windows[-1] if self.windows else {}, self.cuda)}


# The judged figure of a window, first available wins: NVML's (the same for every framework and
# counting the context and workspaces), else the framework's reserved peak, else its allocated
# peak; on CPU the peak RSS.
_CUDA_ORDER = ("nvml_used_bytes", "reserved_peak_bytes", "allocated_peak_bytes")


def judged(entry: dict[str, Any], cuda: bool) -> int | None:
    if not cuda:
        return int(entry["host_rss_bytes"])
    for key in _CUDA_ORDER:
        if entry.get(key) is not None:
            return int(entry[key])
    return None


def source(entry: dict[str, Any], cuda: bool) -> str:
    """Which figure ``judged`` took, for the report."""
    if not cuda:
        return "host_rss_bytes"
    return next((key for key in _CUDA_ORDER if entry.get(key) is not None), "none")


# What frameworks raise when an allocation fails. Types by name (no framework import here);
# messages for errors raised as RuntimeError (torch on CPU, OneFlow) or aborts turned into text.
_OOM_TYPES = {"MemoryError", "OutOfMemoryError", "ResourceExhaustedError"}
_OOM_TEXT = ("out of memory", "not enough memory", "can't allocate memory",
             "cannot allocate memory", "unable to allocate", "std::bad_alloc",
             "resource_exhausted", "oom when allocating", "cuda_error_out_of_memory")


def is_out_of_memory(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(cls.__name__ in _OOM_TYPES for cls in type(current).__mro__):
            return True
        text = str(current).lower()
        if any(marker in text for marker in _OOM_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


# -- --dlperf-memory-limit: a per-rank limit the OS enforces -------------------------------------

def parse_size(raw: str) -> int:
    """Bytes from ``1536M``, ``2G``, ``2GiB``, ``500000000`` (binary units: K/M/G/T are 1024^n)."""
    text = str(raw).strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError(f"expected a size like 2G, 1536M or a byte count, got {raw!r}") from None
    if value < 1 << 20:
        raise ValueError(f"a memory limit under 1 MiB cannot hold a Python process, got {raw!r}")
    return int(value)


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
