"""What the conformance suite (tests/test_conformance.py) needs to know of each framework, in
one table, ``FRAMEWORKS``: its interpreter and how to get it, the variants each contract runs
in, what its ranks report, which way its steps run, and which params stay out of CI and why.
A framework missing from a contract's part of the table has no such check, and a framework
whose interpreter is missing skips, saying how to get it."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from snippets import (
    jax_interpreter,
    mindspore_interpreter,
    mxnet_interpreter,
    oneflow_interpreter,
    still_running_after,
)

from pytest_dlperf.core.phases import BACKWARD, DATA, FORWARD, OPTIMIZER, merged
from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.frameworks import mindspore as mindspore_adapter
from pytest_dlperf.frameworks import mxnet as mxnet_adapter
from pytest_dlperf.frameworks import paddle as paddle_adapter
from pytest_dlperf.frameworks.mindspore import SCHEDULER, SCHEDULER_GRACE_S
from pytest_dlperf.frameworks.mxnet import ROLE, ROLE_GRACE_S

COMPILED_AROUND = "forward-backward and update, not the all-reduce"
# Why MXNet's AMP cannot run on this host's CPU (None: it can).
MXNET_NO_BF16 = mxnet_adapter.cpu_bf16_unavailable(mxnet_adapter.cpu_flags())


@dataclass(frozen=True)
class Average:
    """One way two ranks train a step together: what the ranks then report of it (entries of
    the trainer's environment, together and alone) and, where it stays out of CI, why."""

    name: str
    compiler: str = "eager"
    layout: str = "dp"
    together: Mapping[str, object] = field(default_factory=dict)
    alone: Mapping[str, object] = field(default_factory=dict)
    shards: list[list[int]] | None = None  # each parameter's shape on a rank, where sharded
    outside_ci: str | None = None


@dataclass(frozen=True)
class Window:
    """ResNet-50 steps timed by the meter: which compilers run, which of them return before the
    step's work is done on CPU (there a window without a wait reads short: the control), how
    many steps a window takes and how many warm up first."""

    compilers: tuple[str, ...]
    asynchronous: frozenset[str]
    steps: int
    warmup: int = 3


@dataclass(frozen=True)
class OwnModel:
    """A user's MLP (tests/own_mlp_recipes.py) measured by the plugin on two local nodes, fp32
    and AMP, eager and compiled: the cases that run (the others skip, saying why), entries of
    every case's environment, the phases that take time per compiler, and why it stays out of
    CI where it does."""

    names: tuple[str, ...]
    skipped: str | None = None  # what the skipped cases say
    layouts: tuple[str, ...] = ()  # the layouts marker's, where the module has one
    reports: Mapping[str, object] = field(default_factory=dict)
    phases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    reported: tuple[str, ...] = ("exposed communication",)  # phases reported, maybe 0, if phased
    own_step: bool = True  # each rank times a step of its own, without the all-reduce
    keyword: str = "2n1d"  # pytest's -k: the cases run (their names above)
    outside_ci: str | None = None


@dataclass(frozen=True)
class Store:
    """Where the adapter tells the framework's own store to be: ``prepare`` writes its
    variables into an environment (as a rank's is), ``address`` reads (host, port) back."""

    prepare: Callable[[dict[str, str], DistEnv], None]
    address: Callable[[Mapping[str, str]], tuple[str, ...]]


@dataclass(frozen=True)
class Phases:
    """The diagnostic steps cut into phases by real ranks of the framework, on a small MLP
    (tests/phases_frameworks_mlp_rank.py): the phases each compiler reports, in order; the
    compilers whose two ranks can leave the gradient communication out; the compilers two
    ranks run; whether each compiler needs processes of its own."""

    expected: Mapping[str, tuple[str, ...]]
    switched: frozenset[str] = frozenset()
    two_ranks: tuple[str, ...] = ("eager", "compiled")
    one_trainer_a_process: bool = False


@dataclass(frozen=True)
class MaxBatch:
    """``--dlperf-batch-size max`` on the framework's model of tests/wide_recipes.py, under a
    memory limit; why it stays out of CI where it does."""

    outside_ci: str | None = None


@dataclass(frozen=True)
class Framework:
    """What the contract needs to know of one framework."""

    name: str
    own_interpreter: Callable[[], Path] | None  # None: it runs in pytest's own
    missing: str  # how to get it, said when it is missing
    averages: tuple[Average, ...] = ()
    spare_port: bool = True  # rank 0's own store binds DLPERF_FRAMEWORK_PORT, not MASTER_PORT
    started: tuple[str, float] | None = None  # what rank 0 starts beside it: its tag, its grace
    stray_port: str | None = None  # a variable of the shell's the ranks must not bind
    window: Window | None = None
    optimizers: tuple[str, ...] = ("eager", "compiled")  # the compilers its updates run under
    adamw: tuple[tuple[str, float | None], ...] = ()  # its own AdamW: (compiler, clip) cases
    own_model: OwnModel | None = None
    store: Store | None = None  # a store of its own, placed by the launcher's variables
    phases: Phases | None = None
    max_batch: MaxBatch | None = None

    def python(self) -> str:
        """Its interpreter; skips saying how to get it where it is missing."""
        if self.own_interpreter is None:
            if importlib.util.find_spec(self.name) is None:
                pytest.skip(f"{self.name} is not installed in pytest's interpreter: {self.missing}")
            return sys.executable
        path = self.own_interpreter()
        if not os.access(path, os.X_OK):
            pytest.skip(f"no {self.name} interpreter at {path}: {self.missing}")
        return str(path)


FOUR = (DATA, FORWARD, BACKWARD, OPTIMIZER)
FP32 = ("test_mlp[2n1d-fp32-compiled]", "test_mlp[2n1d-fp32-eager]")
FRAMEWORKS = (
    Framework("torch", None, "pip install torch", optimizers=("eager",)),
    Framework("tensorflow", None, "pip install 'pytest-dlperf[tensorflow]'", averages=(
        Average("eager", together={"xla_compiles": None}, alone={"xla_compiles": None}),
        # On CPU, XLA cannot compile the all-reduce of two workers: compiled around it.
        Average("compiled", "compiled", together={"xla_compiles": COMPILED_AROUND},
                alone={"xla_compiles": "the step"})),
        spare_port=False,  # its workers are named in the spec: no store of its own
        # One phase, its whole tf.function step (the batch read inside it), in either mode.
        # Two workers of TensorFlow cannot set their strategy up twice in a process: eager
        # alone (the compiled step on CPU workers differs only in where XLA compiles).
        phases=Phases(dict.fromkeys(("eager", "compiled"), (merged(FOUR),)),
                      frozenset({"eager"}), two_ranks=("eager",)),
        max_batch=MaxBatch()),
    Framework("oneflow", oneflow_interpreter, "run scripts/setup-oneflow",
              window=Window(("eager", "compiled"), frozenset({"eager", "compiled"}), steps=12),
              # Data then one nn.Graph compiled; its communication cannot be left out there.
              # Its eager trainer then its nn.Graph trainer in one process segfaulted in the
              # graph's phased steps (eager.Sync) in 4 runs of 100 here, 0 of 100 of each alone
              # (2026-11-26; CI's run of that day met it): a rank builds one trainer, so each
              # compiler gets processes of its own.
              phases=Phases({"eager": FOUR, "compiled": (DATA, merged(FOUR[1:]))},
                            frozenset({"eager"}), one_trainer_a_process=True),
              max_batch=MaxBatch()),
    Framework("paddle", None, "pip install 'pytest-dlperf[paddle]'",
              averages=(Average("eager"), Average("compiled", "compiled")),
              window=Window(("eager", "compiled"), frozenset(), steps=8),
              own_model=OwnModel(FP32, "*paddle has no AMP on cpu*Paddle has no CPU mixed*"),
              store=Store(lambda env, dist: paddle_adapter.prepare_environ(env, dist, cuda=False),
                          lambda env: tuple(env["PADDLE_MASTER"].rsplit(":", 1))),
              # The four in both modes (to_static compiles the forward only).
              phases=Phases(dict.fromkeys(("eager", "compiled"), FOUR),
                            frozenset({"eager", "compiled"})),
              max_batch=MaxBatch()),
    Framework("mindspore", mindspore_interpreter, "run scripts/setup-mindspore", averages=(
        Average("eager"), Average("compiled", "compiled")),
        started=(SCHEDULER, SCHEDULER_GRACE_S),
        window=Window(("eager", "compiled"), frozenset({"compiled"}), steps=1),
        # The reducer switched off for half the diagnostic steps; the gradients all-reduced
        # alone. What the step exposes of it may read 0: this MLP's 2,762 gradients take ~3-8
        # ms to all-reduce, within the noise of 4 diagnostic steps of ~50-90 ms.
        own_model=OwnModel(FP32, "*mindspore has no AMP on cpu*no CPU bf16 kernels*", phases={
            "eager": ("forward+backward", "optimizer"),
            "compiled": ("forward+backward+optimizer",)},
            reported=("exposed communication", "data")),
        store=Store(mindspore_adapter.prepare_environ,
                    lambda env: (env["MS_SCHED_HOST"], env["MS_SCHED_PORT"])),
        adamw=tuple((c, clip) for c in ("eager", "compiled") for clip in (None, 0.05)),
        max_batch=MaxBatch()),
    Framework("mxnet", mxnet_interpreter, "run scripts/setup-mxnet", averages=(
        Average("eager", together={"kvstore": "dist_sync"}),
        Average("compiled", "compiled", together={"kvstore": "dist_sync"})),
        started=(ROLE, ROLE_GRACE_S), stray_port="PORT",
        window=Window(("eager", "compiled"), frozenset({"eager", "compiled"}), steps=1),
        adamw=(("eager", None),),
        # The push and pull left out for half the diagnostic steps, and timed alone.
        own_model=OwnModel(
            # bf16 where oneDNN has its kernels (AVX-512): on another CPU the AMP cases skip.
            (*FP32, *(() if MXNET_NO_BF16 else ("test_mlp[2n1d-amp-compiled]",
                                                "test_mlp[2n1d-amp-eager]"))),
            skipped="*MXNet 1.9.1's oneDNN has bf16 kernels for AVX-512 CPUs only*"
            if MXNET_NO_BF16 else None,
            reports={"kvstore": "dist_sync"}, phases=dict.fromkeys(
                ("eager", "compiled"), ("forward", "backward", "optimizer"))),
        max_batch=MaxBatch(),
        store=Store(mxnet_adapter.prepare_environ,
                    lambda env: (env["DMLC_PS_ROOT_URI"], env["DMLC_PS_ROOT_PORT"]))),
    Framework("jax", jax_interpreter, "run scripts/setup-jax", averages=(
        # The weight (torch's 4 x 8, Flax's kernel 8 x 4) and the bias (4); fsdp halves both.
        Average("dp", "compiled", together={"devices": 2}, shards=[[4], [8, 4]]),
        Average("fsdp", "compiled", "fsdp", together={"devices": 2}, shards=[[2], [4, 4]])),
        window=Window(("compiled",), frozenset({"compiled"}), steps=3, warmup=2),
        optimizers=("compiled",),
        # Two of the four cases, each layout and each precision once: all four (and the 1n1d
        # reference each measures) took 74 s of CI's first pass (2026-12-06).
        own_model=OwnModel(
            ("test_mlp[2n1d-fp32-compiled]", "test_mlp[2n1d-fsdp2-amp-compiled]"),
            "*jax has no eager mode to measure: JAX trains under jax.jit*", ("dp", "fsdp"),
            own_step=False,  # its one compiled step holds the all-reduce
            keyword="2n1d and (fsdp2-amp or not fsdp2) and not 2n1d-amp"),
        max_batch=MaxBatch()),
)


def cases(contract: Callable[[Framework], Iterator[tuple[str, tuple[Any, ...], str | None]]]
          ) -> list[Any]:
    """The pytest params of a contract: ``contract`` yields (id, values, why outside CI) per
    framework, the framework first among the values."""
    return [pytest.param(*values, id=f"{framework.name}-{name}" if name else framework.name,
                         marks=[pytest.mark.outside_ci(why)] if why else [])
            for framework in FRAMEWORKS for name, values, why in contract(framework)]


RANK = Path(__file__).with_name("conformance_rank.py")


def job(spec: dict[str, Any], folder: Path) -> str:
    """Code that runs tests/conformance_rank.py on ``spec`` in ``folder`` (where a failed
    MindSpore compile writes its dump), for ``run_snippet`` and ``run_together``."""
    return (f"import os, runpy, sys; sys.path.insert(0, {str(RANK.parent)!r}); "
            f"os.chdir({str(folder)!r}); sys.argv[1:] = [{json.dumps(spec)!r}]; "
            f"runpy.run_path({str(RANK)!r}, run_name='__main__')")


def started_by(framework: Framework, under: Path) -> list[int]:
    """The processes rank 0 starts beside it (its tag in their command line) that run in a
    folder under ``under``, where this session's ranks run: not those of another session's
    ranks (another xdist worker's tests)."""
    import psutil

    assert framework.started is not None
    tag = framework.started[0]
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        if tag in (proc.info["cmdline"] or []) and (proc.info["cwd"] or "").startswith(
                str(under)):
            found.append(proc.pid)
    return found


def left_by(framework: Framework, under: Path) -> list[int]:
    """What rank 0 started beside it that still runs once the ranks have gone, after its grace
    period."""
    assert framework.started is not None
    return still_running_after(lambda: started_by(framework, under), framework.started[1] + 5)
