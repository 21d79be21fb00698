"""The contract every framework's adapter meets, written once and run for each framework: two
ranks average their gradients, a window waits for the steps it times, the adapter's own AdamW is
torch's. What differs by framework (its interpreter, its variants, what it reports, which way its
steps run) is said in one table, ``FRAMEWORKS``; the work runs in real processes under the
framework's own interpreter (``tests/conformance_rank.py``), and a framework whose interpreter
is missing skips, saying how to get it. What only one framework has (its model against torch's
weights, its own quirks) stays in that framework's test file."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from snippets import (
    REPO,
    free_ports,
    jax_interpreter,
    mindspore_interpreter,
    mxnet_interpreter,
    oneflow_interpreter,
    still_running_after,
)

from pytest_dlperf.frameworks.mindspore import SCHEDULER, SCHEDULER_GRACE_S
from pytest_dlperf.frameworks.mxnet import ROLE, ROLE_GRACE_S

RANK = Path(__file__).with_name("conformance_rank.py")
COMPILED_AROUND = "forward-backward and update, not the all-reduce"


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
    adamw: tuple[tuple[str, float | None], ...] = ()  # its own AdamW: (compiler, clip) cases

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


TWINS = "the compiled twin of the eager average, which CI runs"
FRAMEWORKS = (
    Framework("tensorflow", None, "pip install 'pytest-dlperf[tensorflow]'", averages=(
        Average("eager", together={"xla_compiles": None}, alone={"xla_compiles": None}),
        # On CPU, XLA cannot compile the all-reduce of two workers: compiled around it.
        Average("compiled", "compiled", together={"xla_compiles": COMPILED_AROUND},
                alone={"xla_compiles": "the step"})),
        spare_port=False),  # its workers are named in the spec: no store of its own
    Framework("oneflow", oneflow_interpreter, "run scripts/setup-oneflow",
              window=Window(("eager", "compiled"), frozenset({"eager", "compiled"}), steps=12)),
    Framework("paddle", None, "pip install 'pytest-dlperf[paddle]'",
              averages=(Average("eager"), Average("compiled", "compiled")),
              window=Window(("eager", "compiled"), frozenset(), steps=8)),
    Framework("mindspore", mindspore_interpreter, "run scripts/setup-mindspore", averages=(
        Average("eager"), Average("compiled", "compiled", outside_ci=f"10 s: {TWINS}")),
        started=(SCHEDULER, SCHEDULER_GRACE_S),
        window=Window(("eager", "compiled"), frozenset({"compiled"}), steps=1),
        adamw=tuple((c, clip) for c in ("eager", "compiled") for clip in (None, 0.05))),
    Framework("mxnet", mxnet_interpreter, "run scripts/setup-mxnet", averages=(
        Average("eager", together={"kvstore": "dist_sync"}),
        Average("compiled", "compiled", together={"kvstore": "dist_sync"},
                outside_ci=f"3 s: {TWINS}")),
        started=(ROLE, ROLE_GRACE_S), stray_port="PORT",
        window=Window(("eager", "compiled"), frozenset({"eager", "compiled"}), steps=1),
        adamw=(("eager", None),)),
    Framework("jax", jax_interpreter, "run scripts/setup-jax", averages=(
        # The weight (torch's 4 x 8, Flax's kernel 8 x 4) and the bias (4); fsdp halves both.
        Average("dp", "compiled", together={"devices": 2}, shards=[[4], [8, 4]]),
        Average("fsdp", "compiled", "fsdp", together={"devices": 2}, shards=[[2], [4, 4]])),
        window=Window(("compiled",), frozenset({"compiled"}), steps=3, warmup=2)),
)


def cases(contract: Callable[[Framework], Iterator[tuple[str, tuple[Any, ...], str | None]]]
          ) -> list[Any]:
    """The pytest params of a contract: ``contract`` yields (id, values, why outside CI) per
    framework, the framework first among the values."""
    return [pytest.param(*values, id=f"{framework.name}-{name}" if name else framework.name,
                         marks=[pytest.mark.outside_ci(why)] if why else [])
            for framework in FRAMEWORKS for name, values, why in contract(framework)]


def run(python: str, jobs: list[tuple[dict[str, Any], dict[str, str]]], folder: Path,
        timeout: float = 300) -> list[Any]:
    """Each job in a process of its own under ``python``, all at once, with its environment
    over this one's; each prints one JSON line last, returned in order."""
    base = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "GLOG_minloglevel": "2", "TF_CPP_MIN_LOG_LEVEL": "2"}
    procs = [subprocess.Popen([python, str(RANK), json.dumps(job)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**base, **env}, cwd=folder,
                              stdin=subprocess.DEVNULL)
             for job, env in jobs]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def flat(weights: list[list[float]]) -> list[float]:
    return [v for tensor in weights for v in tensor]


# -- two ranks average their gradients -------------------------------------------------------

def averages(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    for average in framework.averages:
        yield average.name, ((framework, average),), average.outside_ci


@pytest.fixture(scope="module", params=cases(averages))
def averaged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Framework, Average, list[Any], list[Any]]:
    """One step of plain SGD through the adapter by two ranks together, each on data of its
    own, and by each rank's data alone: as the launchers start ranks (MASTER_PORT is torchrun's
    store there, unused here; the framework's own store takes the spare port)."""
    framework, average = request.param
    python = framework.python()
    ports = free_ports(3)
    job = {"job": "average", "framework": framework.name, "compiler": average.compiler,
           "layout": average.layout}
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports[0]),
           "DLPERF_FRAMEWORK_PORT": str(ports[1])}
    if framework.stray_port:
        env[framework.stray_port] = str(ports[2])
    workers = None
    if not framework.spare_port:
        env, workers = {}, [f"127.0.0.1:{port}" for port in free_ports(2)]
    ranks = [({**job, "rank": rank, "world": 2, "workers": workers,
               "ports": list(env)[1:3] if rank == 0 else []}, env) for rank in (0, 1)]
    alone = [({**job, "rank": rank, "world": 1}, {}) for rank in (0, 1)]
    found = run(python, ranks + alone, tmp_path_factory.mktemp(framework.name))
    return framework, average, found[:2], found[2:]


def test_two_ranks_average_their_gradients(averaged: tuple[Any, ...]) -> None:
    """Both ranks end the step with the same weights, the mean of what each rank's data alone
    gives: summed gradients would give twice the update, a rank training alone its own."""
    _, _, together, alone = averaged
    assert [r["environment"]["data_parallel_ranks"] for r in together] == [2, 2]
    assert together[0]["before"] == together[1]["before"] == alone[0]["before"]
    first, second = (flat(r["after"]) for r in together)
    assert first == pytest.approx(second, abs=1e-7)
    each = [flat(r["after"]) for r in alone]
    assert each[0] != pytest.approx(each[1], abs=1e-4)  # the ranks' data differ
    assert first == pytest.approx([(a + b) / 2 for a, b in zip(*each)], abs=1e-6)


def test_the_ranks_report_how_they_trained(averaged: tuple[Any, ...]) -> None:
    _, average, together, alone = averaged
    for ranks, expected in ((together, average.together), (alone, average.alone)):
        for key, value in expected.items():
            assert [r["environment"][key] for r in ranks] == [value] * len(ranks), key
    if average.shards is not None:
        assert [r["shards"] for r in together] == [average.shards] * 2


def test_rank_0s_store_takes_the_launchers_spare_port(averaged: tuple[Any, ...]) -> None:
    framework, _, together, _ = averaged
    if not framework.spare_port:
        pytest.skip(f"{framework.name} names every worker in the spec: it has no store")
    # Listening on the spare port, leaving MASTER_PORT to torchrun's agent store.
    assert together[0]["ports"] == {"MASTER_PORT": False, "DLPERF_FRAMEWORK_PORT": True}


def test_what_rank_0_started_leaves_with_the_ranks(averaged: tuple[Any, ...]) -> None:
    """It leaves once the workers are done, or when its tether to rank 0 ends it, a grace
    period after rank 0 has gone (checked the moment the ranks exit, it races them)."""
    framework = averaged[0]
    if framework.started is None:
        pytest.skip(f"{framework.name}'s rank 0 starts no process beside it")
    import psutil

    tag, grace = framework.started

    def left() -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"]) if tag in (p.info["cmdline"] or [])]

    assert still_running_after(left, grace + 5) == []


# -- a window waits for the steps it times ---------------------------------------------------

def windows(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    for compiler in framework.window.compilers if framework.window else ():
        yield compiler, (framework, compiler), None


@pytest.mark.parametrize("framework, mode", cases(windows))
def test_a_window_agrees_with_a_wall_clock(framework: Framework, mode: str,
                                           tmp_path: Path) -> None:
    """The meter's window over ResNet-50 steps agrees with a wall clock read after a blocking
    loss fetch. The same window with a no-op synchronize is the control: it reads under half
    of that clock where the framework's step returns before its work is done (so the first
    check can fail), and agrees with it where the step is done when it returns (were it not,
    this would say the adapter needs a real wait)."""
    window = framework.window
    assert window is not None
    (figures,) = run(framework.python(), [(
        {"job": "window", "framework": framework.name, "compiler": mode,
         "steps": window.steps, "warmup": window.warmup}, {})], tmp_path, timeout=600)
    synced, outside = figures["synchronized"]
    assert 0.9 * outside <= synced <= outside
    unsynced, unsynced_outside = figures["not synchronized"]
    if mode in window.asynchronous:
        assert unsynced < 0.5 * unsynced_outside
    else:
        assert 0.9 * unsynced_outside <= unsynced <= unsynced_outside


# -- an adapter's own AdamW is torch's -------------------------------------------------------

def own_adamws(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    for mode, clip in framework.adamw:
        yield f"{mode}-{'clipped' if clip else 'unclipped'}", (framework, mode, clip), None


@pytest.mark.parametrize("framework, mode, clip", cases(own_adamws))
def test_adamw_is_torchs_over_three_steps(framework: Framework, mode: str, clip: float | None,
                                          tmp_path: Path) -> None:
    """The adapter's AdamW against torch.optim.AdamW on the same weights and gradients, three
    steps: gradients near epsilon (so its placement shows), a matrix decayed by 0.1 beside an
    undecayed bias. A bias correction off by a step, epsilon where a framework's own kernel
    puts it (MindSpore's fused Adam; MXNet's ``adamw_update`` has no bias correction either)
    or decay not scaled by the rate moves the weights by more than the tolerance. Clipped: the
    gradients' global norm clipped to 0.05 inside the update (the first two steps' norms are
    ~0.04 and ~0.12), torch's clip_grad_norm_ before its step."""
    import numpy as np
    import torch

    rng = np.random.default_rng(3)
    start = [rng.standard_normal((4, 3)), rng.standard_normal(3)]
    grads = [[g * scale for g in (rng.standard_normal((4, 3)), rng.standard_normal(3))]
             for scale in (1e-2, 3e-2, 1e-3)]
    decays, lr, betas, eps = [0.1, 0.0], 0.05, (0.9, 0.999), 1e-2
    (got,) = run(framework.python(), [({
        "job": "adamw", "framework": framework.name, "compiler": mode, "clip": clip,
        "start": [w.tolist() for w in start], "grads": [[g.tolist() for g in step]
                                                        for step in grads],
        "decays": decays, "lr": lr, "betas": betas, "eps": eps}, {})], tmp_path)
    params = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in start]
    want = torch.optim.AdamW([{"params": [p], "weight_decay": d}
                              for p, d in zip(params, decays)], lr=lr, betas=betas, eps=eps)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = torch.tensor(g, dtype=torch.float64)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        want.step()
    for mine, theirs in zip(got, params):
        assert np.allclose(mine, theirs.detach().numpy(), rtol=0, atol=2e-6), (mine, theirs)
    assert not np.allclose(got[0], start[0], atol=1e-2)  # the steps moved the weights
