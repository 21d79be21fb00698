"""The process helpers every launcher that starts its own agents shares (local, slurm, and the
network namespace's inner process): the torchrun agent's command line and environment, the
case's folder, starting the agents, waiting for them with a deadline, reaping their whole process
trees, and collecting every rank's JSON result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..core.allocator import Allocator
from ..core.installs import EXPECTED_VARIABLE
from ..core.lifeline import tethered
from ..core.ports import free_loopback_port
from ..core.spec import rank_facing
from ..core.topology import Topology
from ..frameworks import STORE_VARIABLE
from .importpath import rank_pythonpath
from .results import collect, result_file

# After one agent fails, how long the others get to notice and exit on their own.
_FAILURE_GRACE_S = 10.0
# Where the network namespace's process writes the exit status of each command it ran.
EXITS_FILE = "netns-exits.json"


def agent_command(topology: Topology, endpoint: str, run_id: str, spec_path: Path,
                  out_dir: Path, timeout_s: float, local_addr: str | None = "127.0.0.1",
                  is_host: bool | None = None) -> list[str]:
    """One node's ``torchrun`` agent; every launch mode starts these, only where differs.
    ``is_host``: whether this agent hosts the rendezvous store (None: torch decides, by whether
    the endpoint is an address the machine's host name resolves to; a node that is a network
    namespace has an address its host name does not resolve to)."""
    # A node that never arrives would otherwise hold the others for torch's default 900 s.
    conf = f"join_timeout={max(10, int(timeout_s))}"
    if is_host is not None:
        conf += f",is_host={int(is_host)}"
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(topology.nodes),
        "--nproc-per-node", str(topology.devices_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", run_id,
        *(["--local-addr", local_addr] if local_addr else []),
        "--rdzv-conf", conf,
        "--max-restarts", "0",
        "--monitor-interval", "0.5",
        "-m", "pytest_dlperf.rank.worker", str(spec_path), str(out_dir),
    ]


def rank_command(python: str | None, spec_path: Path, out_dir: Path,
                 rank: dict[str, str] | None = None) -> list[str]:
    """A rank started without an agent (``python``: its interpreter, else pytest's), as an agent
    would start it; ``rank``: the variables of this rank alone (``rank_variables``), set through
    ``env`` so that every rank shares one environment and the command line says which it is."""
    prefix = ["env", *(f"{k}={v}" for k, v in rank.items())] if rank else []
    return [*prefix, python or sys.executable, "-u", "-m", "pytest_dlperf.rank.worker", str(spec_path),
            str(out_dir)]


def on_side(command: list[str], spec: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """``command`` (a rank's or an agent's) started in an A/B side's own tree: the spec's
    launch-only ``import_paths`` first on its ``PYTHONPATH``, its ``cwd`` as its working
    folder, the modules its ranks must say where they imported from (``expected_imports``),
    for that process and what it starts alone (the launcher's own helpers, the network
    namespace's process and the lifeline's shim, run pytest's plugin)."""
    paths, cwd = spec.get("import_paths") or [], spec.get("cwd")
    expected = spec.get("expected_imports") or []
    if not paths and not cwd and not expected:
        return command
    prefix = ["env", *(["-C", str(cwd)] if cwd else [])]
    if expected:
        prefix.append(f"{EXPECTED_VARIABLE}={','.join(expected)}")
    if paths:
        prefix.append("PYTHONPATH=" + os.pathsep.join(
            p for p in (*paths, env.get("PYTHONPATH")) if p))
    return [*prefix, *command]


def one_node_environment(env: dict[str, str], topology: Topology,
                         port: int | None = None) -> dict[str, str]:
    """``env`` (``worker_environment``'s) with what torchrun's agent gives the ranks of a
    one-node world that no agent starts: its size, and a free loopback address where rank 0
    hosts the store everything rendezvouses through (torch's env:// process group, the
    ``exchange`` of frameworks that need their peers' addresses); ``port``: that address's
    port, when the launcher chose it (its ``rendezvous``)."""
    env = dict(env)
    size = str(topology.world_size)
    env.update(WORLD_SIZE=size, LOCAL_WORLD_SIZE=size, ROLE_WORLD_SIZE=size, GROUP_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port or free_loopback_port()),
               **{STORE_VARIABLE: "rank0"})
    return env


def rank_variables(rank: int) -> dict[str, str]:
    """Rank ``rank``'s own variables in a one-node world that no agent starts."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank)}


def worker_environment(topology: Topology, tmp_dir: Path, python: str | None,
                       framework_port: int, nodes_share_host: bool,
                       worker_host: str | None = "127.0.0.1",
                       allocator: Mapping[str, Any] | None = None) -> dict[str, str]:
    """What the agents (and so the ranks) inherit. ``python``: the ranks' interpreter, when not
    the agents' own (torchrun reads ``PYTHON_EXEC``). ``framework_port``: a free port on the
    first node for a framework that runs its own rendezvous beside torchrun's store (OneFlow's
    rank 0 listens on its ``MASTER_PORT``, which torchrun's agent store already holds).
    ``nodes_share_host``: several nodes have one host address, so a framework that groups ranks
    into nodes by address (OneFlow) must number them as one host's processes.
    ``worker_host``: the address peers reach this node's ranks at, for a framework that runs
    its own servers (TensorFlow); None: the node's own host name (a real cluster's nodes).
    ``allocator``: the spec's heap allocator (``core.allocator``), set in the environment
    every process of the launch starts with (None: this process's environment as it is)."""
    env = dict(os.environ)
    env.pop("PYTHON_EXEC", None)
    if python:
        env["PYTHON_EXEC"] = python
    threads = str(topology.threads_per_worker)
    env.update(
        OMP_NUM_THREADS=threads,
        MKL_NUM_THREADS=threads,
        # torchelastic leaves torchelastic_* folders and error files in TMPDIR.
        TMPDIR=str(tmp_dir),
        # Workers import the very same pytest_dlperf as the plugin (an A/B side's own code
        # before it: ``on_side``).
        PYTHONPATH=rank_pythonpath(tmp_dir, (), env.get("PYTHONPATH")),
        PYTHONUNBUFFERED="1",
        DLPERF_FRAMEWORK_PORT=str(framework_port),
        DLPERF_NODES_SHARE_HOST="1" if nodes_share_host else "0",
    )
    # Where a framework that runs its own servers (TensorFlow) tells its peers to connect.
    env.pop("DLPERF_WORKER_HOST", None)
    if worker_host:
        env["DLPERF_WORKER_HOST"] = worker_host
    chosen = Allocator.from_json(allocator)
    return env if chosen is None else chosen.environment(env)


def kill_tree(procs: list[subprocess.Popen[bytes]], grace_s: float = 3.0,
              first: int = signal.SIGTERM) -> None:
    """Terminate agents and every worker under them; workers sit in sessions of their own.
    ``first``: the signal sent first (SIGKILL once every rank's result is in: nothing left to
    shut down gracefully), SIGKILL follows for whatever outlives ``grace_s``."""
    victims: list[psutil.Process] = []
    for proc in procs:
        try:
            parent = psutil.Process(proc.pid)
            victims.extend(parent.children(recursive=True))
            victims.append(parent)
        except psutil.NoSuchProcess:
            pass
    for victim in victims:
        try:
            victim.send_signal(first)
        except psutil.NoSuchProcess:
            pass
    alive = _wait_gone(victims, grace_s)
    for victim in alive:
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            pass
    _wait_gone(alive, grace_s)
    for proc in procs:  # reap our direct children: no zombies
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has ended; those still running after ``timeout_s``. A zombie
    has ended: a grandchild stays one until init reaps it, which psutil's wait would wait for
    (over a second a launch here)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in procs if _running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tail(paths: list[Path], limit: int = 6000) -> str:
    text = "".join(p.read_text(errors="replace") for p in paths if p.exists())
    return text[-limit:]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def wait_all(procs: list[subprocess.Popen[bytes]], deadline: float,
             results: Sequence[Path] = ()) -> str:
    """'ok', 'failed' (an agent exited non-zero) or 'timeout'. 'ok' also as soon as every file
    of ``results`` exists (each rank writes its own atomically, last thing before it exits):
    the agents' own wind-down (torchrun's monitor interval, its exit barrier, two interpreters'
    teardown) took ~2 s a launch here, for nothing the case needs; the caller reaps them."""
    failed_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return "ok" if all(c == 0 for c in codes) else "failed"
        if results and all(path.exists() for path in results):
            return "ok"
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if failed_at is not None and now - failed_at > _FAILURE_GRACE_S:
            return "failed"
        if now > deadline:
            return "timeout"
        time.sleep(0.1)


def prepare(spec: dict[str, Any], run_dir: Path) -> tuple[Path, Path, Path]:
    """The case's folder: spec.json, results/ (one file per rank), tmp/ (workers' TMPDIR)."""
    out_dir, tmp_dir = run_dir / "results", run_dir / "tmp"
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps(rank_facing(spec), sort_keys=True, indent=2))
    return spec_path, out_dir, tmp_dir


def new_run_id() -> str:
    return f"dlperf-{uuid.uuid4().hex[:12]}"


@dataclass
class Processes:
    """One launch's processes, from ``start`` to ``stop``: the phases the protocol names for a
    launcher that starts processes (local, slurm). ``ranks_themselves``: command i is rank i,
    not an agent (or the one command is the network namespace's process around them, which
    writes their exit statuses to ``EXITS_FILE``): a rank that ends without a result is
    reported with its own exit status."""

    run_dir: Path
    out_dir: Path
    world_size: int
    timeout_s: float
    ranks_themselves: bool = False
    # Seconds the commands get to end by themselves once every result is in, before they are
    # ended (SIGTERM, then SIGKILL): srun's, so that it hears its tasks exit and ends the step
    # with Slurm; killed, it left each node's slurmstepd retrying to reach it (~2 s) and the
    # step's CPUs held until the tasks ended on their own, the next step pending behind them.
    wind_down_s: float = 0.0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    outcome: str = "interrupted"
    ended: list[int | None] = field(default_factory=list)  # exit statuses before the reaping
    _deadline: float = 0.0
    _previous: Any = None
    _stopped: bool = False

    def start(self, commands: list[list[str]], env: dict[str, str],
              death_signal: int = signal.SIGKILL) -> Processes:
        """Start the commands, each in a session of its own; each gets ``death_signal`` if
        pytest dies without reaping it (``lifeline``). Whatever started is stopped if another
        cannot start."""
        self.logs = [self.run_dir / f"launch-{i}.log" for i in range(len(commands))]
        self._deadline = time.monotonic() + self.timeout_s
        # SIGTERM (a CI runner cancelling the job) unwinds like Ctrl-C, so that ``stop`` reaps
        # the workers instead of orphaning them.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            for command, log in zip(commands, self.logs):
                with open(log, "wb") as fh:
                    self.procs.append(subprocess.Popen(
                        tethered(command, death_signal), stdout=fh, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, env=env, start_new_session=True))
        except BaseException:
            self.stop()
            raise
        return self

    def collect(self) -> list[dict[str, Any]]:
        """Wait (bounded) until every rank handed its result to the run folder, reap the
        processes (a rank's memory cgroup is released only once they are gone), and read
        every rank's result (``results.collect``)."""
        self.outcome = wait_all(self.procs, self._deadline,
                                [result_file(self.out_dir, r) for r in range(self.world_size)])
        self.ended = [p.poll() for p in self.procs]
        self.stop()
        exits = (_rank_exits(self.ended, self.run_dir)
                 if self.ranks_themselves and self.outcome != "ok" else {})
        return collect(self.out_dir, self.world_size, self.outcome, self.timeout_s,
                       _tail(self.logs + sorted(self.run_dir.glob("agent-*.log"))
                             + sorted(self.run_dir.glob("rank-*.log"))), exits)

    def stop(self) -> None:
        """Reap every process tree (also on Ctrl-C: no worker outlives its case); once."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.outcome == "ok" and self.wind_down_s > 0:
                deadline = time.monotonic() + self.wind_down_s
                while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
                    time.sleep(0.05)
            first = (signal.SIGKILL if self.outcome == "ok" and not self.wind_down_s
                     else signal.SIGTERM)
            kill_tree(self.procs, first=first)
        finally:
            if self._previous is not None:
                signal.signal(signal.SIGTERM, self._previous)


def run_processes(commands: list[list[str]], env: dict[str, str], run_dir: Path, out_dir: Path,
                  world_size: int, timeout_s: float,
                  death_signal: int = signal.SIGKILL,
                  ranks_themselves: bool = False) -> list[dict[str, Any]]:
    """Start the commands, wait (bounded), reap their whole trees, collect every rank's JSON:
    ``Processes``' phases in one call."""
    launch = Processes(run_dir, out_dir, world_size, timeout_s, ranks_themselves)
    try:
        return launch.start(commands, env, death_signal).collect()
    finally:
        launch.stop()


def _rank_exits(ended: list[int | None], run_dir: Path) -> dict[int, int]:
    """The non-zero exit statuses of ranks started as the commands themselves, by rank, of
    those that ended on their own (not the ones reaped after another failed)."""
    codes = ended
    inner = run_dir / EXITS_FILE
    if inner.exists():  # the network namespace's process ran them
        try:
            codes = json.loads(inner.read_text())
        except ValueError:
            codes = []
    return {rank: code for rank, code in enumerate(codes) if code not in (None, 0)}
