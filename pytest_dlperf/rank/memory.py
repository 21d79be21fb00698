"""Memory on the worker side: a rank's peak memory over a timed window, and what an
out-of-memory error looks like in each framework.

Runs in every training rank: standard library only (ranks may run under another Python).

- **Page faults**: the minor page faults the rank's process took over each window (every thread,
  ``getrusage``): pages the heap got fresh from the kernel. A step that takes many has an
  allocator handing memory back and fetching it again (glibc under thresholds that are too low
  for the step's tensors: ``core.allocator``), which the step's time pays for.
- **CPU**: the rank's peak resident set size. Linux keeps a resettable high-water mark per
  process: writing ``5`` to ``/proc/self/clear_refs`` sets ``VmHWM`` (``/proc/self/status``)
  back to the current RSS, so the peak of one window is read without sampling. Where that file
  cannot be written, the figure is the process's lifetime peak (``getrusage``), and says so.
- **CUDA**: the framework's own peak counters (``Trainer.peak_memory``, reset before each
  window by ``Trainer.reset_peak_memory``), and NVML's used memory of this process, which
  counts what no framework counter sees (the CUDA context, cuDNN/cuBLAS workspaces, NCCL
  buffers) and is the same figure for every framework. NVML has no peak, only what the process
  holds now: read at the end of a window, after the framework's caching allocator (each
  keeps what it once reserved) grew to the window's high-water mark.
"""

from __future__ import annotations

import os
import resource
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
        self._faults = 0

    def before_window(self) -> None:
        self.rss.reset()
        self._faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        if self.cuda:
            self.trainer.reset_peak_memory()

    def after_window(self) -> None:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self._faults
        entry: dict[str, Any] = {"host_rss_bytes": self.rss.peak(), "minor_faults": faults}
        if self.cuda:
            entry.update(self.trainer.peak_memory())
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


