"""The worker side: what runs inside each training rank.

``python -m pytest_dlperf.rank.worker SPEC.json OUT_DIR`` is the command every launcher starts (torchrun
agents locally, srun on Slurm, ...). It reads a plain JSON spec, trains under the protocol, and
hands back plain JSON timings, or the rank's traceback if it failed: to ``OUT_DIR/rank-<RANK>.json``
(the default result channel), or, through ``rank_result``, to a launcher that carries it its own
way.
It imports neither pytest nor the plugin's pytest side, and runs on Python 3.10+.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import sysconfig
import time
import traceback
from pathlib import Path
from typing import Any

from .. import frameworks
from ..core import allocator
from ..core.cgroup import apply_limit
from ..core.installs import imported
from ..core.jsonio import write_json_atomic
from ..core.lifeline import die_with_parent, expected_parent
from ..core.recipes import load_recipe
from ..core.spec import RankSpec
from ..core.workload import WorkloadError
from ..frameworks import DeviceUnavailable, DistEnv, Trainer
from ..frameworks import _contract as contract
from . import barrier as barriers
from . import phases as phase_steps
from .memory import WindowMemory, is_out_of_memory
from .progress import RankProgress
from .timing import measure

# This package's folder: frames in it are the plugin's, the rest the user's or a framework's.
# Both spellings: ranks may import it through a link (launch.importpath), and a frame's file is
# the path it was imported by.
_PLUGIN_DIRS = tuple({str(Path(__file__).resolve().parents[1]) + os.sep,
                      os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep})


class Diverged(RuntimeError):
    """The loss stopped being finite: the case measures nothing meaningful any more."""


def result_path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank-{rank}.json"


def build(spec: RankSpec, dist: DistEnv) -> Trainer:
    """The framework's trainer for this rank, the workload's recipe imported."""
    recipe = load_recipe(spec.recipe) if spec.recipe is not None else None
    # a user's own adapter through the shim: its trainer's optional members completed
    adapter = contract.adapter(frameworks.load(spec.framework, spec.adapter_path),
                               spec.framework)
    trainer: Trainer = adapter.build_trainer(spec, dist, recipe)
    return trainer


def run(spec: RankSpec | dict[str, Any], dist: DistEnv) -> dict[str, Any]:
    """Train under the protocol in this rank and return its plain-JSON timings."""
    if not isinstance(spec, RankSpec):
        spec = RankSpec.from_json(spec)
    protocol = spec.protocol
    heap = checked_heap(spec)
    layout = spec.parallel(dist.world_size)
    live = (RankProgress(spec.progress,
                         layout.units_per_step(spec.batch_size, spec.units_per_sample),
                         spec.unit)
            if spec.progress and dist.rank == 0 else None)
    if live is not None:
        live.event("started")
    trainer = build(spec, dist)
    losses: list[float] = []
    memory = WindowMemory(trainer, spec.device_type == "cuda", dist.local_rank)

    def check_loss(window: int) -> None:
        memory.after_window()  # first: reading the loss allocates nothing the window did
        loss = trainer.loss()
        losses.append(loss)
        if not math.isfinite(loss):
            raise Diverged(f"rank {dist.rank}: loss is {loss} after timed window {window}")

    duet = barriers.of(spec.to_json())

    def before_window(window: int) -> None:
        memory.before_window()
        if duet is not None:  # last: the window's clock starts when every rank is here
            duet.wait(f"window-{window}")

    try:
        measurement = measure(
            protocol, trainer.step, trainer.synchronize, after_window=check_loss,
            before_window=before_window,
            progress=None if live is None else (
                lambda phase, index, total, elapsed: live.event(phase, index, total, elapsed,
                                                                protocol.steps)))
        if duet is not None:  # no side's wind-down beside the other's last window
            duet.wait("end")
        local, phases = after_windows(trainer, spec, dist)
        # The rank's interpreter, which the fingerprint records (not pytest's: OneFlow's ranks
        # run under their own), the heap it ran on, and where its own code came from (what an
        # A/B side's ranks really ran: ``core.sources`` checks it).
        environment = {"python": platform.python_version(), **trainer.environment(), **heap,
                       "imports": imported()}
    finally:
        trainer.close()
        if live is not None:
            live.close()
    flops = count_flops(spec, dist)
    return {"rank": dist.rank, "node_rank": dist.node_rank, "local_rank": dist.local_rank,
            "world_size": dist.world_size, "host": platform.node(), "losses": losses,
            "memory": memory.to_json(), "local_step_s": local, "flops": flops,
            "phases": phases,
            "environment": environment, **measurement.to_json()}


def checked_heap(spec: RankSpec) -> dict[str, Any]:
    """The heap this rank runs on, as its environment records it; ``AllocatorError`` before
    anything is built where it is not the one the spec asks for (a rank never measures another
    heap than its case's)."""
    heap = allocator.in_effect()
    wanted = spec.allocator
    if wanted is not None:
        allocator.check(wanted, heap)
    return {"allocator": wanted.label if wanted is not None else None,
            "allocator_in_effect": heap}


def count_flops(spec: RankSpec, dist: DistEnv) -> dict[str, Any] | None:
    """Rank 0's FLOP count where the spec asks for it, after everything timed: counting builds
    the model once more and frees it, which moves glibc's dynamic thresholds
    (``core.allocator``); before the windows it made that launch's steps 1.3-1.8x faster than
    the other launches' on a small CPU model."""
    if not (spec.count_flops and dist.rank == 0):
        return None
    from .flops import count_in_rank

    return count_in_rank(spec)


# Steps of a rank's own, after the timed windows, for the straggler check (docs/resources.md "Stragglers").
LOCAL_STEPS = 5


def local_step_s(trainer: Trainer, steps: int) -> float | None:
    """Seconds per step of this rank's own computation (forward and backward, no collective),
    after the timed windows: under data parallelism every rank's window lasts as long as the
    slowest one's (each step ends in an all-reduce), so windows cannot tell which rank is slow.
    Every rank runs these steps at the same time, sharing the host as in training. None where
    the adapter has no ``local_step``."""
    step = trainer.local_step
    if step is None:
        return None
    synchronize = trainer.local_synchronize
    step()  # its first call may trace or build what it needs
    synchronize()
    # Each step timed alone, the median kept: one step disturbed by a neighbour (the other
    # ranks' host work, pytest itself) does not make a rank a straggler.
    times = []
    for _ in range(max(1, min(steps, LOCAL_STEPS))):
        begin = time.perf_counter()
        step()
        synchronize()
        times.append(time.perf_counter() - begin)
    return sorted(times)[len(times) // 2]


def after_windows(trainer: Trainer, spec: RankSpec, dist: DistEnv
                  ) -> tuple[float | None, dict[str, Any] | None]:
    """What runs after the timed windows: the straggler check's own steps, which compare ranks
    that each run the whole model alone (DDP's no_sync; a rank of a sharded layout cannot run
    a step without the others), then the phases' diagnostic steps."""
    many = dist.world_size > 1
    local = (local_step_s(trainer, spec.protocol.steps)
             if many and spec.parallel(dist.world_size).is_data_parallel else None)
    return local, diagnose_phases(trainer, spec.phase_steps, dist.world_size)


def diagnose_phases(trainer: Trainer, steps: int, world_size: int) -> dict[str, Any] | None:
    """The step cut into phases, after everything timed (docs/phases.md); None where the spec
    asks for none or the adapter cannot cut its step."""
    plan = trainer.phase_plan() if steps else None
    if plan is None:
        return None
    return phase_steps.diagnose(plan, trainer.synchronize, steps,
                                communicating=world_size > 1)


def error_text(exc: BaseException) -> str:
    """What a rank reports of its failure. The plugin's own errors (a diverged loss, a workload
    that breaks the rules) are their message. An error raised in the user's code or a framework
    is its traceback cut to what the user needs: their own frames, and the last frame of the
    library that raised (a shape error in a layer: that layer's line), without the plugin's
    plumbing or the framework's calls in between (DDP's forward, ``Module._call_impl``: ~20
    frames a rank, each rank alike). An error raised in the plugin alone (a bug to report)
    keeps its whole traceback."""
    if isinstance(exc, (Diverged, DeviceUnavailable, WorkloadError, barriers.BarrierError,
                        allocator.AllocatorError)):
        return f"{type(exc).__name__}: {exc}\n"
    summary = traceback.TracebackException.from_exception(exc)
    left_out = _trim(summary, set())
    text = "".join(summary.format())
    if left_out:
        text += (f"({left_out} frame(s) of pytest-dlperf and of library calls between your "
                 "code and the error left out)\n")
    return text


# Where installed packages and the standard library live: frames there are a library's.
_LIBRARY_DIRS = tuple({path for name in ("stdlib", "platstdlib", "purelib", "platlib")
                       if (path := sysconfig.get_paths().get(name))})


def _is_library(filename: str) -> bool:
    return (filename.startswith(_LIBRARY_DIRS) or "site-packages" in filename
            or "dist-packages" in filename or filename.startswith("<"))


def _trim(summary: traceback.TracebackException, seen: set[int]) -> int:
    """Cuts ``summary``'s frames (and its chained exceptions') to the user's and the last
    library frame; returns how many were left out."""
    if id(summary) in seen:
        return 0
    seen.add(id(summary))
    frames = list(summary.stack)
    outside = [frame for frame in frames if not frame.filename.startswith(_PLUGIN_DIRS)]
    kept = frames
    if outside:
        user = [i for i, frame in enumerate(outside) if not _is_library(frame.filename)]
        last = user[-1] if user else -1
        kept = [outside[i] for i in user] + outside[last + 1:][-1:]
        summary.stack = traceback.StackSummary.from_list(kept)
    left_out = len(frames) - len(kept)
    for linked in (summary.__cause__, summary.__context__):
        if linked is not None:
            left_out += _trim(linked, seen)
    return left_out


def own_cpus(cpus: list[int], local_rank: int, local_ranks: int) -> list[int]:
    """A duet rank's cores: its share of its side's, in local-rank order (all of them where
    there are fewer cores than ranks)."""
    share = len(cpus) // max(1, local_ranks)
    return cpus[local_rank * share:(local_rank + 1) * share] if share else list(cpus)


def place(spec: dict[str, Any], dist: DistEnv) -> None:
    """A duet side's cores and devices for this rank, before any framework is imported (thread
    pools and CUDA size themselves then)."""
    if spec.get("visible_devices") is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(spec["visible_devices"])
    if spec.get("cpus"):
        cpus = own_cpus(list(spec["cpus"]), dist.local_rank, dist.local_world_size)
        os.sched_setaffinity(0, cpus)
        threads = str(spec.get("threads") or len(cpus))
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = threads


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m pytest_dlperf.rank.worker SPEC.json OUT_DIR", file=sys.stderr)
        return 2
    # End with the agent that started this rank, whatever ends it (it ends with pytest). A rank
    # started without an agent (one node's ranks) is the shim's own process: the shim tied it
    # to its starter already, and the signal outlives the exec.
    parent = expected_parent()
    if parent is not None and parent != os.getpid():
        die_with_parent(parent=parent)
    spec = json.loads(Path(argv[0]).read_text())
    out_dir = Path(argv[1])
    dist = DistEnv.from_environ(dict(os.environ))
    if spec.get("memory_limit"):  # before any framework allocates anything
        apply_limit(int(spec["memory_limit"]), str(out_dir), dist.rank,
                    int(spec.get("batch_size", 0)))
    place(spec, dist)
    duet = barriers.of(spec)
    try:
        result = run(spec, dist)
    except BaseException as exc:
        if duet is not None:
            duet.break_(_broken(exc, dist))
        hand_off(out_dir, failure(spec, dist, exc))
        if isinstance(exc, DeviceUnavailable):
            print(f"rank {dist.rank}: {exc}", file=sys.stderr)
            return 1
        raise
    hand_off(out_dir, result)
    return 0


# -- the result channel ------------------------------------------------------------------------
# A rank hands back one plain-JSON dict: its timings, or its ``failure``. Started as a process
# (``main``), it hands it to the default channel, a file in the run folder that the launcher
# reads (``launch.results``). A launcher whose ranks share no folder with pytest calls
# ``rank_result`` inside the rank and carries the dict its own way (external mode: a c10d
# store; a Ray actor: its return value).


def hand_off(out_dir: Path, result: dict[str, Any]) -> None:
    """The default channel: ``OUT_DIR/rank-<RANK>.json``, written atomically, the last thing
    the rank does (the launcher stops waiting once every rank's file is there)."""
    write_json_atomic(result_path(out_dir, int(result["rank"])), result)


def rank_result(spec: RankSpec | dict[str, Any], dist: DistEnv) -> dict[str, Any]:
    """This rank's result, or its ``failure``, for a launcher that runs the rank in a process
    of its own choosing and carries the result itself; a duet's barrier is broken for the
    other side when this rank fails. The process is placed as a started rank is (a duet side's
    cores and devices: ``place``), so call it before the process imports a framework. A case
    under a memory limit fails here, saying why: the limit's cgroup and the file that tells
    its OOM kill from a crash belong to a rank started as ``main`` (the local and slurm
    launchers)."""
    as_json = spec.to_json() if isinstance(spec, RankSpec) else spec
    try:
        if as_json.get("memory_limit"):
            raise RuntimeError(
                "this case runs under a memory limit (--dlperf-memory-limit, or a bsz=max "
                "search), which a rank handing its result back through rank_result cannot "
                "apply: run it with the local or slurm launcher, whose ranks start as "
                "python -m pytest_dlperf.rank.worker")
        place(as_json, dist)
        return run(spec, dist)
    except Exception as exc:
        duet = barriers.of(as_json)
        if duet is not None:
            duet.break_(_broken(exc, dist))
        return failure(as_json, dist, exc)


def failure(spec: dict[str, Any], dist: DistEnv, exc: BaseException) -> dict[str, Any]:
    """What a rank that failed hands back: its error, and its type as the launch's kind reads
    it (``unavailable``, ``diverged``, ``out_of_memory``, else the exception's name)."""
    if isinstance(exc, DeviceUnavailable):
        return {"rank": dist.rank, "error": f"{type(exc).__name__}: {exc}",
                "error_type": "unavailable"}
    oom = is_out_of_memory(exc)
    error = error_text(exc)
    if oom:
        error = (f"rank {dist.rank} ran out of memory at batch {spec.get('batch_size')} "
                 f"(per device): {error}")
    return {"rank": dist.rank, "error": error,
            "error_type": ("diverged" if isinstance(exc, Diverged) else
                           "out_of_memory" if oom else type(exc).__name__)}


def _broken(exc: BaseException, dist: DistEnv) -> str:
    """Why a duet's barrier is broken, as the other side's ranks read it."""
    if isinstance(exc, DeviceUnavailable):
        return f"rank {dist.rank}: {exc}"
    return f"rank {dist.rank}: {type(exc).__name__}: {exc}"

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
