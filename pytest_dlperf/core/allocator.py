"""The heap allocator a rank runs under (``--dlperf-allocator``): chosen once a session, set the
same way in every launch, checked in the rank and recorded in the results and the fingerprint.

Why it is part of the case: glibc's malloc serves a request above its mmap threshold with
fresh mmapped pages, gives its heap's free top back to the kernel above its trim threshold, and
raises both *dynamically* when the process frees an mmapped block (glibc's ``free``: the
threshold becomes the block's size and the trim threshold twice that, up to 32 MiB on 64-bit).
A training step's speed then depends on what its process happened to allocate and free first:
a small MLP's CPU step ran ~1.5x faster, and took ~1,200 fewer page faults a step, after one
FLOP count on torch's meta device had freed a 2 MiB weight (docs/measurements.md). Setting
either threshold (environment or ``mallopt``) turns the dynamic rule off, so fixed thresholds
put every launch in the same state whatever ran before its first timed step.

Choices (``parse``):

- ``glibc`` (default): glibc with both thresholds fixed at ``GLIBC_MMAP`` / ``GLIBC_TRIM``,
  the highest the dynamic rule itself reaches: the state a long training process's glibc ends
  in once it has freed a large block, from the first step on;
- ``glibc:MMAP,TRIM``: glibc with other fixed thresholds (``glibc:4M,32M``);
- ``glibc-dynamic``: glibc as it comes (its thresholds follow the process's history);
- ``jemalloc``, ``tcmalloc``: preloaded (``LD_PRELOAD``), found on this machine;
- a path to a shared library: preloaded (mimalloc, a build of one's own).

Standard library only: the rank checks what it runs under (``check``) under any Python.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MiB = 1 << 20
# glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (4 MiB x sizeof(long)), and the trim threshold
# the dynamic rule sets beside it (twice the mmap threshold).
GLIBC_MMAP = 32 * MiB
GLIBC_TRIM = 64 * MiB

GLIBC, DYNAMIC, PRELOAD = "glibc", "glibc-dynamic", "preload"
DEFAULT = GLIBC
MMAP_VARIABLE, TRIM_VARIABLE = "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"
# glibc's knobs of the same rule: cleared, so that only the choice decides.
_GLIBC_VARIABLES = (MMAP_VARIABLE, TRIM_VARIABLE, "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold",
             "glibc.malloc.top_pad", "glibc.malloc.mmap_max")
# Allocators a preload may already name (the user's LD_PRELOAD): replaced by the choice.
_ALLOCATOR_LIBRARY = re.compile(r"lib(jemalloc|tcmalloc|mimalloc|tbbmalloc_proxy|hoard)[^/]*$")
# mallopt takes an int: the largest threshold both ways of setting one accept alike.
_LARGEST = (1 << 31) - 1
_DEBIAN = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}
# Where torch's CPU launcher (torch.backends.xeon.run_cpu) looks for a preloadable allocator,
# after the dynamic linker's cache.
_LIBRARY_NAMES = {"jemalloc": ("jemalloc",), "tcmalloc": ("tcmalloc", "tcmalloc_minimal")}


class AllocatorError(RuntimeError):
    """The rank does not run under the allocator the case asked for."""


def _size(text: str) -> int:
    """Bytes from ``32M``, ``128K``, ``4194304`` (binary units)."""
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": MiB, "G": 1 << 30}.get(raw[-1:], 1)
    try:
        value = int(float(raw[:-1] if scale != 1 else raw) * scale)
    except ValueError:
        raise ValueError(f"expected a size like 32M, 128K or a byte count, got {text!r}") \
            from None
    if not 0 <= value <= _LARGEST:
        raise ValueError(f"a threshold is 0 to 2 GiB - 1 (mallopt's int), got {text!r}")
    return value


def _short(value: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", MiB), ("K", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


@dataclass(frozen=True)
class Allocator:
    """One choice of heap allocator: ``kind`` glibc (fixed thresholds), glibc-dynamic or
    preload (``library``, a path or a name the dynamic linker finds; ``name`` as shown)."""

    kind: str = GLIBC
    mmap_threshold: int | None = GLIBC_MMAP
    trim_threshold: int | None = GLIBC_TRIM
    library: str | None = None
    name: str | None = None

    @property
    def label(self) -> str:
        """What the fingerprint and the tables say: ``glibc mmap=32M trim=64M``,
        ``glibc-dynamic``, ``jemalloc``."""
        if self.kind == GLIBC:
            return (f"glibc mmap={_short(self.mmap_threshold or 0)} "
                    f"trim={_short(self.trim_threshold or 0)}")
        if self.kind == DYNAMIC:
            return DYNAMIC
        file = Path(self.library or "?").name
        # tcmalloc is two libraries (the full one and the minimal one): the file says which.
        return f"{self.name} ({file})" if self.name and self.name != file else file

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Allocator | None:
        return None if data is None else cls(**dict(data))

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` as the rank's processes must start under this choice: glibc's threshold
        variables and tunables, and allocator libraries in ``LD_PRELOAD``, replaced by the
        choice's own (a user's other preloads and variables kept)."""
        out = {k: v for k, v in env.items() if k not in _GLIBC_VARIABLES}
        tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":")
                    if t and t.split("=", 1)[0] not in _TUNABLES]
        out.pop("GLIBC_TUNABLES", None)
        if tunables:
            out["GLIBC_TUNABLES"] = ":".join(tunables)
        preloads = [p for p in re.split(r"[:\s]+", env.get("LD_PRELOAD", ""))
                    if p and not _ALLOCATOR_LIBRARY.search(p)]
        if self.kind == PRELOAD and self.library:
            preloads.insert(0, self.library)
        out.pop("LD_PRELOAD", None)
        if preloads:
            out["LD_PRELOAD"] = ":".join(preloads)
        if self.kind == GLIBC:
            out[MMAP_VARIABLE] = str(self.mmap_threshold)
            out[TRIM_VARIABLE] = str(self.trim_threshold)
        return out


def find_library(name: str) -> str | None:
    """A preloadable jemalloc or tcmalloc on this machine: the dynamic linker's cache, then
    the folders torch's CPU launcher searches (this Python's prefix, a conda or virtual
    environment, /usr/local/lib, /usr/lib)."""
    for stem in _LIBRARY_NAMES[name]:
        found = ctypes.util.find_library(stem)
        if found:
            return found
    folders = [os.path.join(sys.prefix, "lib"), *(os.path.join(os.environ[v], "lib") for v in
               ("CONDA_PREFIX", "VIRTUAL_ENV") if os.environ.get(v)),
               os.path.expanduser("~/.local/lib"), "/usr/local/lib", "/usr/local/lib64",
               "/usr/lib", "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]
    for folder in folders:
        for stem in _LIBRARY_NAMES[name]:
            for path in sorted(Path(folder).glob(f"lib{stem}.so*")):
                return str(path)
    return None


def parse(raw: str) -> Allocator:
    """``--dlperf-allocator``'s value; ``ValueError`` saying what is accepted otherwise."""
    text = str(raw).strip()
    if text == GLIBC:
        return Allocator()
    if text.startswith(GLIBC + ":"):
        parts = text[len(GLIBC) + 1:].split(",")
        if len(parts) != 2:
            raise ValueError(f"glibc's fixed thresholds are glibc:MMAP,TRIM (glibc:4M,32M), "
                             f"got {text!r}")
        mmap, trim = (_size(p) for p in parts)
        return Allocator(GLIBC, mmap, trim)
    if text == DYNAMIC:
        return Allocator(DYNAMIC, None, None)
    if text in _LIBRARY_NAMES:
        found = find_library(text)
        if found is None:
            raise ValueError(f"{text} was not found on this machine (the dynamic linker's "
                             "cache, /usr/lib, /usr/local/lib, this Python's prefix): install "
                             f"it (Debian: {_DEBIAN[text]}) or give the library's path")
        return Allocator(PRELOAD, None, None, found, text)
    if "/" in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ValueError(f"no shared library at {text} to preload")
        return Allocator(PRELOAD, None, None, str(path.resolve()), path.name)
    raise ValueError("expected glibc (fixed thresholds, the default), glibc:MMAP,TRIM, "
                     f"glibc-dynamic, jemalloc, tcmalloc or a library's path, got {text!r}")


# -- inside the rank ---------------------------------------------------------------------------

class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def malloc_library() -> str | None:
    """The file of the shared object whose ``malloc`` this process calls (the first in the
    global lookup order: a preloaded allocator's, else the C library's); None where the
    dynamic linker cannot say.

    A non-PIE executable that takes ``malloc``'s address (Debian's /usr/bin/python3.11) holds
    the symbol's canonical address itself, a stub jumping to the real one: there the answer is
    the first preloaded library that defines ``malloc``, else the C library."""
    try:
        process = ctypes.CDLL(None)
        found = _defining_file(process, process)
        if found is None or found != os.path.realpath("/proc/self/exe"):
            return found
        for name in _preloaded():
            try:
                library = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            except OSError:
                continue
            defining = _defining_file(process, library)
            if defining is not None and os.path.basename(defining).split(".so")[0] == \
                    os.path.basename(os.path.realpath(name)).split(".so")[0]:
                return defining
        return _defining_file(process, ctypes.CDLL(ctypes.util.find_library("c")
                                                   or "libc.so.6"))
    except (OSError, AttributeError, TypeError):
        return None


def _defining_file(process: ctypes.CDLL, handle: ctypes.CDLL) -> str | None:
    """The file holding the ``malloc`` that ``handle``'s lookup finds."""
    address = ctypes.cast(handle.malloc, ctypes.c_void_p).value
    dladdr = getattr(process, "dladdr", None)
    if dladdr is None:  # glibc before 2.34 keeps it in libdl
        dladdr = ctypes.CDLL(ctypes.util.find_library("dl") or "libdl.so.2").dladdr
    info = _DlInfo()
    if not dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(bytes(info.dli_fname).decode())


def _preloaded() -> list[str]:
    """LD_PRELOAD's libraries, then /etc/ld.so.preload's, in the dynamic linker's order."""
    names = re.split(r"[:\s]+", os.environ.get("LD_PRELOAD", ""))
    try:
        names += Path("/etc/ld.so.preload").read_text().split()
    except OSError:
        pass
    return [name for name in names if name]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def mmapped(size: int) -> bool | None:
    """Whether glibc serves a block of ``size`` bytes with pages of its own (mmap), read
    through ``mallinfo2``'s count of such blocks around one allocation (glibc 2.33+); None
    where that cannot be told."""
    try:
        libc = ctypes.CDLL(None)
        info = libc.mallinfo2
        info.restype = _MallInfo2
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        before = info().hblks
        block = libc.malloc(ctypes.c_size_t(size))
        after = info().hblks
        libc.free(block)
    except (OSError, AttributeError):
        return None
    return bool(block) and after > before


def in_effect(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What this process's heap runs under, as the results record it: the library serving
    ``malloc``, glibc's threshold variables, and whether glibc took the mmap threshold they
    set (a block just below it comes from the heap; older glibc refuses one above 32 MiB)."""
    env = os.environ if environ is None else environ
    seen: dict[str, Any] = {"malloc": malloc_library(),
                            **{k: env[k] for k in _GLIBC_VARIABLES if k in env}}
    if env.get("GLIBC_TUNABLES"):
        seen["GLIBC_TUNABLES"] = env["GLIBC_TUNABLES"]
    threshold = env.get(MMAP_VARIABLE, "")
    if _is_glibc(seen["malloc"]) and threshold.isdigit() and int(threshold) > 64 << 10:
        below = mmapped(int(threshold) - (64 << 10))
        if below is not None:
            seen["mmap_threshold_held"] = not below
    return seen


def _is_glibc(library: str | None) -> bool:
    return library is not None and bool(re.search(r"/libc[.-][^/]*$", library))


def check(wanted: Allocator, seen: Mapping[str, Any]) -> None:
    """``AllocatorError`` where ``seen`` (``in_effect``) is not ``wanted``: a preload the
    dynamic linker ignored, thresholds the environment lost on the way to the rank."""
    library = seen.get("malloc")
    if wanted.kind == PRELOAD:
        expected = os.path.basename(os.path.realpath(wanted.library or ""))
        if library is None or os.path.basename(library).split(".so")[0] != \
                expected.split(".so")[0]:
            raise AllocatorError(
                f"--dlperf-allocator {wanted.label}: this rank's malloc is "
                f"{library or 'unknown'}, not {wanted.library}: the dynamic linker did not "
                "preload it here (is the library on this node, at that path?)")
        return
    if library is not None and not _is_glibc(library):
        raise AllocatorError(
            f"--dlperf-allocator {wanted.label}: this rank's malloc is {library}, not glibc's: "
            "take it out of LD_PRELOAD, or measure it by naming it (--dlperf-allocator PATH); "
            "on a C library other than glibc choose jemalloc, tcmalloc or a library's path")
    if wanted.kind == DYNAMIC:
        fixed = sorted(k for k in _GLIBC_VARIABLES if k in seen)
        if fixed:
            raise AllocatorError(f"--dlperf-allocator {DYNAMIC}: this rank started with "
                                 f"{', '.join(fixed)} set, which turn glibc's dynamic "
                                 "thresholds off")
        return
    if wanted.kind == GLIBC:
        got = (seen.get(MMAP_VARIABLE), seen.get(TRIM_VARIABLE))
        if got != (str(wanted.mmap_threshold), str(wanted.trim_threshold)):
            raise AllocatorError(
                f"--dlperf-allocator {wanted.label}: this rank started with "
                f"{MMAP_VARIABLE}={got[0]} and {TRIM_VARIABLE}={got[1]}: the launcher did not "
                "pass the plugin's environment to it")
        if seen.get("mmap_threshold_held") is False:
            raise AllocatorError(
                f"--dlperf-allocator {wanted.label}: glibc did not take {MMAP_VARIABLE}="
                f"{got[0]} (a block just below it was still mmapped; glibc before 2.35 refuses "
                "a threshold above 32 MiB and then keeps 128 KiB): choose a lower one")


# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def apply_in_process(wanted: Allocator) -> None:
    """For a rank that is pytest's own process (external mode), started before any choice:
    fixed glibc thresholds through ``mallopt`` (which also turns the dynamic rule off); a
    preload or glibc's dynamic rule cannot be had after the start, and ``AllocatorError``
    says how to start pytest instead."""
    seen = in_effect()
    if wanted.kind == GLIBC and _is_glibc(seen.get("malloc")):
        libc = ctypes.CDLL(None)
        if not (libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(wanted.mmap_threshold or 0))
                and libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(wanted.trim_threshold or 0))):
            raise AllocatorError(f"--dlperf-allocator {wanted.label}: glibc's mallopt refused "
                                 "the thresholds")
        # As a launched rank's environment says them (``check``, the results), and for the
        # processes this one starts.
        os.environ.update({MMAP_VARIABLE: str(wanted.mmap_threshold),
                           TRIM_VARIABLE: str(wanted.trim_threshold)})
        return
    try:
        check(wanted, seen)
    except AllocatorError as exc:
        raise AllocatorError(
            f"{exc}; in external mode the rank is pytest's own process, which started before "
            f"the plugin could choose: start pytest on every rank with {_start_under(wanted)}"
        ) from None


def _start_under(wanted: Allocator) -> str:
    """How to start a process under ``wanted``, as a message says it."""
    if wanted.kind == PRELOAD:
        return f"LD_PRELOAD={wanted.library}"
    if wanted.kind == DYNAMIC:
        return "no MALLOC_ threshold variables and no allocator in LD_PRELOAD"
    return (f"{MMAP_VARIABLE}={wanted.mmap_threshold} {TRIM_VARIABLE}={wanted.trim_threshold} "
            "and no allocator in LD_PRELOAD")
