"""What the adapters share whose frameworks need processes besides the ranks: MindSpore's
cluster scheduler, MXNet's key-value store scheduler and server. Rank 0 starts them on the first
node, at the launcher's spare port, under the rank's own interpreter, tethered to it: a killed
rank 0 (a crash, a launcher's timeout) once left MindSpore's scheduler waiting for workers that
would never come, reparented to init, for minutes (issue 42), and ps-lite's roles wait forever.

Standard library only: rank 0 calls this before its framework is imported.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, MutableMapping

TETHER_FD = "DLPERF_TETHER_FD"


def spare_port(environ: Mapping[str, str], who: str) -> str:
    """The port ``who`` (a framework's process, for the message) listens on, on the first node:
    the launcher's spare port (``DLPERF_FRAMEWORK_PORT``: under torchrun, MASTER_PORT is the
    agent's store); ranks started with no agent and no spare port (srun under
    ``--dlperf-launcher external``) use MASTER_PORT, which nothing else serves then."""
    port = environ.get("DLPERF_FRAMEWORK_PORT")
    if port:
        return port
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise RuntimeError(
            f"{who} needs a free port on the first node: torchrun's agent holds MASTER_PORT "
            "and DLPERF_FRAMEWORK_PORT is not set; export DLPERF_FRAMEWORK_PORT=<a free port "
            "on the first node> for every rank")
    return environ.get("MASTER_PORT", "0")


def ipv4(host: str, who: str) -> str:
    """``host`` (MASTER_ADDR: the first node's name on a Slurm cluster) as the IPv4 address
    ``who`` needs, resolved where this rank runs."""
    try:
        return socket.gethostbyname(host)
    except (OSError, UnicodeError) as err:
        raise RuntimeError(f"MASTER_ADDR={host!r} does not resolve on this node ({err}): {who} "
                           "needs the first node's IPv4 address") from err


def own_address(root: str, port: int) -> str:
    """The address this node reaches the first node (``root``) from, which the others reach it
    at: ps-lite and gloo otherwise announce an address of their own choosing (ps-lite its first
    non-loopback interface's, whatever the route; gloo its hostname's, 127.0.0.1 inside a node's
    network namespace). A UDP socket's connect sends nothing; it asks the kernel for the
    route's source address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((root, port or 9))
        return str(probe.getsockname()[0])


def tethered(body: str, grace_s: int) -> str:
    """A ``python -c`` program that runs ``body`` tethered to the process that starts it
    (``start``): that process holds the only write end of a pipe whose read end the program
    gets (``TETHER_FD``); a watcher forked before ``body`` runs (a framework's start-up may hold
    the GIL, so a thread might never run) reads EOF when the starter has gone and SIGKILLs the
    program ``grace_s`` later (the other ranks' own leaving may still need it). The watcher has
    PR_SET_PDEATHSIG: it goes with the program at once."""
    return f"""import ctypes, os, select, signal, sys, time
tether, role = int(os.environ["{TETHER_FD}"]), os.getpid()
if os.fork() == 0:
    if sys.platform == "linux":  # gone with the role at once, not at the next poll
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    while os.getppid() == role:
        if select.select([tether], [], [], 0.5)[0] and not os.read(tether, 1):
            time.sleep({grace_s})
            if os.getppid() == role:
                os.kill(role, signal.SIGKILL)
            break
    os._exit(0)
os.close(tether)
""" + body


def start(program: str, environs: list[MutableMapping[str, str]]
          ) -> list[subprocess.Popen[bytes]]:
    """``program`` (``tethered``) once per environment, children of this process under this
    interpreter, in its process group (a launcher that stops the group stops them too), silent.
    The pipe's write end stays open, uninherited, for this process's lifetime."""
    read, _write = os.pipe()
    started = []
    try:
        for environ in environs:
            started.append(subprocess.Popen(
                [sys.executable, "-c", program], env={**environ, TETHER_FD: str(read)},
                pass_fds=(read,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
    finally:
        os.close(read)
    return started
