"""Nothing the plugin starts outlives pytest, whatever ends it (SIGKILL included).

SIGTERM and Ctrl-C unwind through ``run_processes``, which reaps every tree. SIGKILL cannot be
caught, so each process in the chain asks the kernel to signal it when its parent dies (Linux's
parent-death signal, ``prctl(PR_SET_PDEATHSIG)``), link by link:

    pytest -> [network-namespace process] -> torchrun agent -> rank
    pytest -> [network-namespace process] -> rank   (one node's ranks: no agent)
    pytest -> srun (SIGTERM: srun's own handling ends the step on every node) -> agent -> rank

A process pytest starts goes through ``tethered``: a few lines of Python (no package import)
that set the signal, check the parent did not die before that, and ``exec`` the real command in
the same process. Ranks, started by torchrun's agent, call ``die_with_parent`` themselves before
anything else; the shim told them which agent to expect (``DLPERF_LIFELINE_PID``), so a rank whose
agent died while it was starting ends too. A rank started without an agent is the shim's process
itself, tied already. Elsewhere than Linux this does nothing: there only SIGTERM and Ctrl-C are
covered.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

# The pid of the process a shim became (an agent, say): its children check their parent is it.
PID_VARIABLE = "DLPERF_LIFELINE_PID"
_PR_SET_PDEATHSIG = 1

# sys.argv: -c PARENT SIGNAL COMMAND...; PARENT "-" exports the pid only (an agent that srun
# started on a node: Slurm's step owns its life). One line, so that logs and ps show it whole.
_SHIM = (
    "import ctypes, os, sys; parent, sig, command = sys.argv[1], int(sys.argv[2]), sys.argv[3:]; "
    "linked = parent != '-' and sys.platform.startswith('linux') "
    "and ctypes.CDLL(None).prctl(1, sig, 0, 0, 0) == 0; "
    "linked and os.getppid() != int(parent) and os.kill(os.getpid(), sig); "
    f"os.environ['{PID_VARIABLE}'] = str(os.getpid()); os.execvp(command[0], command)"
)


def tethered(command: list[str], sig: int = signal.SIGKILL, parent: int | None = None) -> list[str]:
    """``command``, started so that it receives ``sig`` when the process starting it (``parent``,
    default this one) dies. ``parent=-1``: no signal, only the pid its children expect."""
    owner = "-" if parent == -1 else str(os.getpid() if parent is None else parent)
    return [sys.executable, "-I", "-S", "-c", _SHIM, owner, str(int(sig)), *command]


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Ask the kernel for ``sig`` when this process's parent dies; if ``parent`` (the pid it
    must have) is already gone, take ``sig`` now. False where the kernel offers no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    if ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def expected_parent(environ: Mapping[str, str] | None = None) -> int | None:
    """The pid this process's parent must have, as the shim that started the parent said."""
    value = (os.environ if environ is None else environ).get(PID_VARIABLE, "")
    return int(value) if value.isdigit() else None


# -- scratch folders of runs that died -------------------------------------------------------

OWNER_FILE = "owner.json"


def claim(folder: Path) -> None:
    """Mark ``folder`` as this process's scratch, so that a later run can tell it was left
    behind (``sweep``) once this process is gone."""
    import psutil

    me = psutil.Process()
    (folder / OWNER_FILE).write_text(json.dumps(
        {"pid": me.pid, "started": me.create_time(), "host": socket.gethostname()}))


def sweep(parent: Path, pattern: str) -> list[Path]:
    """Remove the folders matching ``pattern`` under ``parent`` whose owner (``claim``) was a
    process of this host that is gone: a run killed too hard to clean up after itself. Folders
    of live runs, of other hosts (a shared filesystem) and without an owner file are kept."""
    import shutil

    removed = []
    for folder in sorted(parent.glob(pattern)):
        try:
            owner = json.loads((folder / OWNER_FILE).read_text())
            pid, started, host = int(owner["pid"]), float(owner["started"]), str(owner["host"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if host == socket.gethostname() and not alive(pid, started):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def alive(pid: int, started: float) -> bool:
    """Whether process ``pid`` still runs and is the one that started at ``started`` (not a
    later process that reuses the number)."""
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # exists but cannot be inspected: not ours to judge
