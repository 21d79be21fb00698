"""Slurm mode: inside an allocation, one torchrun agent per node through ``srun``, with a c10d
rendezvous on the allocation's first node.

pytest runs once (on the batch host or a login node with ``salloc``); ``srun`` places one agent
on each of the first ``--nodes`` nodes and each agent starts ``--devices-per-node`` workers. The
case's folder must be on a filesystem every node sees: the plugin puts it under the rootdir.

A launch that fails says on which nodes, from what srun, slurmstepd and torchrun printed
(``srun: error: node2: task 1: Killed``, ``*** STEP 7.0 ON node1 CANCELLED ***``, torchrun's
``host : node2`` beside the rank) and the names of the peer addresses in the ranks' errors.
Once srun has begun to end a step it waits for every node to confirm; a node that is gone never
does (srun waited until pytest's timeout here: Slurm declares a node down only after
``SlurmdTimeout``), so srun gets Slurm's ``KillWait`` and a few seconds more, then is ended,
and the nodes it never heard from are named.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...core.lifeline import tethered
from ...core.topology import Topology
from ..base import Launcher, LaunchError
from ..processes import Processes, agent_command, new_run_id, on_side, prepare, worker_environment
from ..protocol import LauncherProtocol, Rendezvous

# How long srun gets to end its step by itself once every rank's result is in (its tasks' own
# wind-down: torchrun's exit barrier, two interpreters' teardown; ~2 s here), before it is told
# to end it (SIGTERM: srun signals the tasks and ends the step with Slurm).
WIND_DOWN_S = 30.0


@dataclass(frozen=True)
class SlurmAllocation:
    job_id: str
    nodelist: str
    nodes: int
    gpus_per_node: int | None

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> SlurmAllocation | None:
        job = environ.get("SLURM_JOB_ID")
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
        if not job or not nodelist:
            return None
        count = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
        gpus = environ.get("SLURM_GPUS_ON_NODE")
        return cls(job_id=job, nodelist=nodelist,
                   nodes=int(count) if count else len(expand_nodelist(nodelist)),
                   gpus_per_node=int(gpus) if gpus and gpus.isdigit() else None)

    def hostnames(self) -> list[str]:
        """Slurm's own expansion (``scontrol show hostnames``), else the simple forms."""
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", self.nodelist],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
            names = out.split()
        except (OSError, subprocess.SubprocessError):
            names = expand_nodelist(self.nodelist)
        return names


def expand_nodelist(nodelist: str) -> list[str]:
    """``gpu[01-03,07],login1`` -> gpu01 gpu02 gpu03 gpu07 login1 (one bracket per name)."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{number:0{len(low)}d}")
    return names



class SlurmLauncher(Launcher):
    name = "slurm"
    all_nodes_here = False

    def __init__(self, allocation: SlurmAllocation) -> None:
        self.allocation: SlurmAllocation = allocation

    def node_devices(self, device_type: str) -> tuple[int, str] | None:
        gpus = self.allocation.gpus_per_node
        if device_type == "cuda" and gpus:
            return gpus, "GPUs per node in the Slurm allocation"
        return None

    def why_not_shape(self, nodes: int, devices_per_node: int, device_type: str) -> str | None:
        allocation = self.allocation
        if nodes <= allocation.nodes:
            return None
        return (f"--nodes={nodes}, but Slurm allocation {allocation.job_id} has "
                f"{allocation.nodes} node(s) ({allocation.nodelist}); pass --nodes "
                f"{allocation.nodes} or less, or allocate more nodes")

    def rendezvous(self, topology: Topology, run_dir: Path) -> Rendezvous:
        """The first node of the step, at a port spread out so that concurrent jobs' on that
        node do not collide."""
        host = self.allocation.hostnames()[0]
        port = 20000 + random.Random(os.getpid() ^ hash(run_dir)).randrange(20000)
        return Rendezvous(host, port, new_run_id())

    def start(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
              meeting: Rendezvous, timeout_s: float) -> SlurmStep:
        spec_path, out_dir, tmp_dir = prepare(spec, run_dir)
        hosts = self.allocation.hostnames()[: topology.nodes]
        # Slurm nodes are separate hosts, unless the allocation lists one host twice.
        env = worker_environment(topology, tmp_dir, spec.get("python"), meeting.port + 1,
                                 nodes_share_host=len(set(hosts)) < len(hosts), worker_host=None,
                                 allocator=spec.get("allocator"))
        agent = on_side(agent_command(topology, meeting.endpoint, meeting.run_id, spec_path,
                                      out_dir, timeout_s, local_addr=None), spec, env)
        command = [
            "srun", f"--nodes={topology.nodes}", f"--ntasks={topology.nodes}",
            "--ntasks-per-node=1", f"--nodelist={','.join(hosts)}", "--kill-on-bad-exit=1",
            "--export=ALL",
            # On each node the agent tells its ranks its pid (they end with it); Slurm's step,
            # not a parent-death signal, ends the agent.
            *tethered(agent, parent=-1),
        ]
        # Processes logs its one command (srun) there.
        watch = StepWatch(run_dir / "launch-0.log", str(spec_path))
        watch.start()
        try:
            # If pytest dies, srun gets SIGTERM: its own handling signals the step's tasks on
            # every node and ends the step (SIGKILL would leave the remote tasks to Slurm's
            # timeouts).
            processes = Processes(run_dir, out_dir, topology.world_size, timeout_s,
                                  wind_down_s=WIND_DOWN_S).start(
                [command], env, death_signal=signal.SIGTERM)
        except BaseException:
            watch.stop()
            raise
        return SlurmStep(processes, watch, hosts)

    def collect(self, launch: SlurmStep, timeout_s: float) -> list[dict[str, Any]]:
        """The ranks' files in the run folder (on a filesystem every node sees); a failure
        names the nodes."""
        try:
            return launch.processes.collect()
        except LaunchError as error:
            raise with_nodes(error, launch.hosts, launch.watch.unanswered(launch.hosts),
                             job_state(self.allocation.job_id)) from None

    def stop(self, launch: SlurmStep) -> None:
        try:
            launch.processes.stop()
        finally:
            launch.watch.stop()


def make(environ: dict[str, str]) -> SlurmLauncher:
    """``--dlperf-launcher slurm``: inside the allocation this environment names."""
    allocation = SlurmAllocation.from_environ(environ)
    if allocation is None:
        raise LookupError("--dlperf-launcher=slurm, but this is not inside a Slurm "
                          "allocation (no SLURM_JOB_ID / SLURM_JOB_NODELIST); run under "
                          "salloc or sbatch")
    return SlurmLauncher(allocation)


@dataclass
class SlurmStep:
    """One launch's srun step: its process, the watch over its log, its nodes."""

    processes: Processes
    watch: StepWatch
    hosts: list[str]


# -- which nodes: what srun, slurmstepd and torchrun said ---------------------------------------

# srun: "srun: error: node2: task 1: Exited with exit code 1" (or "tasks 0-1: Killed")
_SRUN_TASK = re.compile(r"^srun: error: (\S+): tasks? ([0-9,\-]+): (.+?)\s*$", re.MULTILINE)
# slurmstepd: "*** STEP 7.0 ON node1 CANCELLED AT 2026-11-25T01:01:01 DUE TO TIME LIMIT ***"
_CANCELLED = re.compile(r"\*\*\* (STEP|JOB) (\S+) ON (\S+) CANCELLED AT \S+(?: DUE TO (.+?))? "
                        r"\*\*\*")
# srun, when a node dies with the step on it
_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)", re.MULTILINE)
# torchrun's failure summary: "host : node2" a line before "rank : 1 (local_rank: 0)"
_TORCHRUN_HOST = re.compile(r"host\s*:\s*(\S+)\s*\n[^\n]*?rank\s*:\s*(\d+)")
# srun ending the step (--kill-on-bad-exit, a cancel, a signal)
_ENDING = re.compile(r"^srun: (?:launch/slurm: _step_signal: Terminating|forcing job termination"
                     r"|Job step aborted)", re.MULTILINE)
# a peer in a rank's error: gloo's "[10.1.2.3]:4567", or "10.1.2.3:4567"
_ADDRESS = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?=\]|:\d)")


def with_nodes(error: LaunchError, hosts: list[str], unanswered: list[str],
               job_state: str | None = None) -> LaunchError:
    """``error`` with the nodes named: each rank's where torchrun said, what srun and
    slurmstepd reported per node, the nodes srun never heard from (``unanswered``), the job's
    state when it is no longer running (``job_state``: CANCELLED, TIMEOUT, NODE_FAIL, ...),
    and the node behind each peer address in the ranks' errors."""
    log = error.log_tail
    notes = []
    ranks = {int(rank): host for host, rank in _TORCHRUN_HOST.findall(log)}
    summary = error.summary
    for rank, host in ranks.items():  # its first mention
        summary = re.sub(rf"\brank {rank}\b(?! \(on)", f"rank {rank} (on {host})", summary, count=1)
    first_task = _SRUN_TASK.search(log)
    for found in _CANCELLED.finditer(log):
        kind, ident, node, why = found.groups()
        if first_task and first_task.start() < found.start() and _ENDING.search(log):
            note = f"srun ended {kind.lower()} {ident} after a task failed (--kill-on-bad-exit)"
        else:
            note = (f"Slurm cancelled {kind.lower()} {ident} (on {node}"
                    + (f", due to {why.lower()}" if why else "") + ")")
        if note not in notes:
            notes.append(note)
    if job_state and not job_state.startswith("RUNNING"):
        notes.append(f"the job is {job_state}")
    notes += [f"srun: node failure on {node}" for node in dict.fromkeys(_NODE_FAILURE.findall(log))]
    tasks = [f"{node} (task {task}): {what}" for node, task, what
             in dict.fromkeys(_SRUN_TASK.findall(log))]
    if tasks:
        notes.append("srun: " + ", ".join(tasks))
    if unanswered:
        notes.append(f"srun was ending the step and heard nothing more from "
                     f"{', '.join(unanswered)} (the node, or its slurmstepd, is gone?): ended "
                     "srun")
    errors = {rank: _name_addresses(text) for rank, text in error.rank_errors.items()}
    if notes:
        summary += f" [nodes {', '.join(hosts)}: " + "; ".join(notes) + "]"
    return replace(error, summary=summary, rank_errors=errors)


def job_state(job_id: str, settle_s: float = 3.0) -> str | None:
    """The job's state as slurmctld says (``RUNNING``, ``CANCELLED``, ``TIMEOUT (...)``),
    else None. A job COMPLETING gets ``settle_s`` to say how it ended."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                                 text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        found = re.search(r"\bJobState=(\S+)(?: Reason=(\S+))?", out)
        if not found:
            return None
        if found.group(1) != "COMPLETING" or time.monotonic() > deadline:
            reason = found.group(2)
            return found.group(1) + (f" ({reason})" if reason and reason != "None" else "")
        time.sleep(0.2)


def _name_addresses(text: str, limit: int = 4) -> str:
    """``text`` with the host name after each IPv4 address a reverse lookup names."""
    named: dict[str, str] = {}
    for address in dict.fromkeys(_ADDRESS.findall(text)):
        if len(named) >= limit or address.startswith("127."):
            continue
        try:
            named[address] = socket.gethostbyaddr(address)[0]
        except (OSError, UnicodeError):
            continue
    for address, name in named.items():
        text = re.sub(rf"((?<![\d.]){re.escape(address)}(?:\]?:\d+|\]))", rf"\1 ({name})", text)
    return text


class StepWatch(threading.Thread):
    """Follows srun's log. Once srun has begun to end the step (a task failed:
    ``--kill-on-bad-exit``; or it was cancelled), the tasks get Slurm's ``KillWait`` to end;
    a node that is gone never confirms, and srun would wait for Slurm to declare it down
    (``SlurmdTimeout``, minutes). So srun gets ``KillWait`` + ``EXTRA_S``, then is ended: the
    launch fails at once, naming the nodes srun never heard from."""

    EXTRA_S = 10.0

    def __init__(self, log: Path, marker: str) -> None:
        super().__init__(daemon=True, name="dlperf-srun-watch")
        self.log, self.marker = log, marker
        self.ended_srun = False
        self._done = threading.Event()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)

    def run(self) -> None:
        deadline: float | None = None
        while not self._done.wait(0.2):
            if deadline is None:
                text = self._text()
                if _ENDING.search(text) or _SRUN_TASK.search(text):
                    deadline = time.monotonic() + _kill_wait() + self.EXTRA_S
            elif time.monotonic() > deadline:
                self.ended_srun = _kill_srun(self.marker)
                return

    def _text(self, tail: int = 1 << 16) -> str:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - tail))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def unanswered(self, hosts: list[str]) -> list[str]:
        """The nodes srun reported nothing about, when it had to be ended."""
        if not self.ended_srun:
            return []
        text = self._text()
        heard = {node for node, _, _ in _SRUN_TASK.findall(text)}
        return [host for host in hosts if host not in heard]


def _kill_wait(default: float = 30.0) -> float:
    """Slurm's KillWait: the seconds between SIGTERM and SIGKILL to a step's tasks."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return default
    found = re.search(r"^KillWait\s*=\s*(\d+)", out, re.MULTILINE)
    return float(found.group(1)) if found else default


def _kill_srun(marker: str) -> bool:
    """SIGKILL to this process's srun whose command line names ``marker`` (the case's spec)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if child.name() == "srun" and marker in " ".join(child.cmdline()):
                child.kill()
                return True
        except psutil.Error:
            continue
    return False


# mypy checks the launcher against the protocol here.
_PROTOCOL: type[LauncherProtocol[SlurmStep]] = SlurmLauncher
