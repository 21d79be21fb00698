"""The MXNet adapter: ranks from the plugin's launchers (a distributed key-value store whose
scheduler and server rank 0 starts, roles from their variables), the update DDP's
averaged-gradient step, torch's AdamW, windows that wait for MXNet's asynchronous engine, and
cases under pytest.

MXNet runs under its own interpreter (``scripts/setup-mxnet``, or ``DLPERF_TEST_MXNET_PYTHON``):
every MXNet line here runs in a subprocess under it, and the tests skip without it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from snippets import (
    WINDOW_AGAINST_A_CLOCK,
    free_ports,
    in_a_file,
    run_snippet,
    run_together,
    still_running_after,
)

from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.frameworks.mxnet import ROLE, ROLE_GRACE_S, prepare_environ

REPO = Path(__file__).resolve().parents[1]

STEP = """
import json, sys
sys.path.insert(0, "tests")
from pytest_dlperf import SGD, Workload
from pytest_dlperf.frameworks import DistEnv, load
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.core.recipes import load_recipe
workload = Workload("linear", recipes={"mxnet": "optimizer_recipes:mxnet_random"},
                    batch_size={"cpu": 4}, sizes={"data_rank": RANK},
                    optimizer=SGD(lr_per_256=0.1 * 256 / 4, momentum=0.0))
spec = spec_for("mxnet", workload, protocol=QUICK, device_type="cpu", compiler=COMPILER)
dist = DistEnv(RANK, WORLD, RANK, WORLD, 0) if WORLD > 1 else DistEnv(0, 1, 0, 1, 0)
trainer = load("mxnet").build_trainer(spec, dist, load_recipe(spec.recipe))
before = [p.data().asnumpy().tolist() for p in trainer.params]
trainer.step()
trainer.synchronize()
after = [p.data().asnumpy().tolist() for p in trainer.params]
env = trainer.environment()
trainer.close()
print(json.dumps({"before": before, "after": after, "ranks": env["data_parallel_ranks"],
                  "kvstore": env["kvstore"]}))
"""


def _flat(weights: list[Any]) -> list[float]:
    out: list[float] = []
    for value in weights:
        out.extend(_flat(value) if isinstance(value, list) else [float(value)])
    return out


def roles() -> list[int]:
    """MXNet schedulers and servers the adapter started that still run."""
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if ROLE in (p.info["cmdline"] or [])]


@pytest.mark.parametrize("mode", ["eager", pytest.param("compiled", marks=pytest.mark.outside_ci(
    "3 s: the hybridized twin of the eager average, which CI runs"))])
def test_two_ranks_average_their_gradients(mode: str, mxnet_python: str) -> None:
    """Two ranks through the adapter (the store's roles from the launcher's variables, its
    scheduler on the spare port, a shell's PORT ignored), each on its own data: one step of
    plain SGD leaves both with the same weights, the mean of what each rank's data alone gives
    (the store's sum unscaled would give twice the update, a rank alone its own)."""
    ports = free_ports(3)
    head = f"COMPILER = {mode!r}\n"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports[0]),
           "DLPERF_FRAMEWORK_PORT": str(ports[1]), "PORT": str(ports[2])}
    together: list[Any] = run_together(
        mxnet_python, [head + f"RANK, WORLD = {rank}, 2\n" + STEP for rank in (0, 1)], env,
        timeout=120)
    alone: list[Any] = [run_snippet(mxnet_python, head + f"RANK, WORLD = {rank}, 1\n" + STEP)
                        for rank in (0, 1)]
    assert [(r["ranks"], r["kvstore"]) for r in together] == [(2, "dist_sync")] * 2
    assert together[0]["before"] == together[1]["before"] == alone[0]["before"]
    first, second = (_flat(r["after"]) for r in together)
    assert first == pytest.approx(second, abs=1e-7)
    each = [_flat(r["after"]) for r in alone]
    assert each[0] != pytest.approx(each[1], abs=1e-4)  # the ranks' data differ
    assert first == pytest.approx([(a + b) / 2 for a, b in zip(*each)], abs=1e-6)
    # They exit once the workers finalized, or ROLE_GRACE_S after rank 0 has gone.
    assert still_running_after(roles, ROLE_GRACE_S + 5) == []


ADAMW = """
import json
import mxnet as mx
import numpy as np
from pytest_dlperf.frameworks._mxnet_adamw import adamw
start, grads, decays = json.loads(DATA)
opt = adamw(mx)(learning_rate=LR, betas=BETAS, epsilon=EPS, wd=1.0)
weights = [mx.nd.array(np.array(w, np.float32)) for w in start]
states = [opt.create_state(i, w) for i, w in enumerate(weights)]
opt.set_wd_mult({i: d for i, d in enumerate(decays)})
opt.idx2name = {i: str(i) for i in range(len(weights))}
for per_step in grads:
    for i, (w, g) in enumerate(zip(weights, per_step)):
        opt.update(i, w, mx.nd.array(np.array(g, np.float32)), states[i])
print(json.dumps([w.asnumpy().tolist() for w in weights]))
"""


def test_adamw_is_torchs_over_three_steps(mxnet_python: str, tmp_path: Path) -> None:
    """The adapter's AdamW against torch.optim.AdamW on the same weights and gradients, three
    steps: gradients near epsilon (so its placement shows), a matrix decayed by 0.1 beside an
    undecayed bias. MXNet's own ``adamw_update`` kernel (no bias correction, decay not scaled by
    the rate) moves the weights by more than the tolerance."""
    import numpy as np
    import torch

    rng = np.random.default_rng(3)
    start = [rng.standard_normal((4, 3)), rng.standard_normal(3)]
    grads = [[g * scale for g in (rng.standard_normal((4, 3)), rng.standard_normal(3))]
             for scale in (1e-2, 3e-2, 1e-3)]
    decays, lr, betas, eps = [0.1, 0.0], 0.05, (0.9, 0.999), 1e-2
    data = json.dumps([[w.tolist() for w in start], [[g.tolist() for g in step]
                                                     for step in grads], decays])
    code = f"DATA, LR, BETAS, EPS = {data!r}, {lr}, {betas}, {eps}\n" + ADAMW
    got = run_snippet(mxnet_python, in_a_file(code, tmp_path))
    params = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in start]
    want = torch.optim.AdamW([{"params": [p], "weight_decay": d}
                              for p, d in zip(params, decays)], lr=lr, betas=betas, eps=eps)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = torch.tensor(g, dtype=torch.float64)
        want.step()
    assert isinstance(got, list)
    for mine, theirs in zip(got, params):
        assert np.allclose(mine, theirs.detach().numpy(), rtol=0, atol=2e-6), (mine, theirs)
    assert not np.allclose(got[0], start[0], atol=1e-2)  # the steps moved the weights


ORPHAN = """
import json, os, time
from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.frameworks.mxnet import prepare_environ, start_roles
prepare_environ(os.environ, DistEnv(0, 2, 0, 2, 0))
print(json.dumps([role.pid for role in start_roles(os.environ)]), flush=True)
time.sleep(600)
"""


def test_the_scheduler_and_server_leave_with_rank_0(mxnet_python: str) -> None:
    """Rank 0 killed before its workers joined (a crash, a launcher's timeout): the scheduler
    and the server it started, waiting for workers that will never come, leave within seconds
    (ps-lite's roles wait forever otherwise)."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1",
           "DLPERF_FRAMEWORK_PORT": str(free_ports(1)[0])}
    rank0 = subprocess.Popen([mxnet_python, "-c", ORPHAN], stdout=subprocess.PIPE,
                             text=True, env=env, stdin=subprocess.DEVNULL)
    assert rank0.stdout is not None
    started = [psutil.Process(pid) for pid in json.loads(rank0.stdout.readline())]
    time.sleep(3)  # the roles under way (importing MXNet, then serving)
    assert all(p.is_running() for p in started)
    rank0.send_signal(signal.SIGKILL)
    rank0.wait()
    gone, alive = psutil.wait_procs(started, timeout=30)
    for process in alive:
        process.kill()
    assert alive == [], "rank 0's scheduler or server outlived it by 30 s"


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_a_window_waits_for_mxnet(mode: str, mxnet_python: str) -> None:
    """MXNet's engine runs a step after ``step`` has returned, eager and hybridized alike, on
    CPU too. One ResNet-50 step: the meter's window agrees with a wall clock read after a
    blocking loss fetch; with a no-op synchronize the window reads under half of that clock
    (the control: the check can fail)."""
    figures = run_snippet(mxnet_python, f"COMPILER, STEPS = {mode!r}, 1\n" + """
from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.models import RESNET50
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.rank.worker import build
spec = spec_for("mxnet", RESNET50, protocol=QUICK, device_type="cpu", compiler=COMPILER,
                sizes={"image_size": 32})
trainer = build(spec, DistEnv(0, 1, 0, 1, 0))
for _ in range(3):
    trainer.step()
""" + WINDOW_AGAINST_A_CLOCK, timeout=600)
    assert isinstance(figures, dict)
    window, outside = figures["synchronized"]
    assert 0.9 * outside <= window <= outside
    unsynced_window, unsynced_outside = figures["not synchronized"]
    assert unsynced_window < 0.5 * unsynced_outside


def test_the_store_takes_the_launchers_spare_port() -> None:
    environ = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "PORT": "29500",
               "DLPERF_FRAMEWORK_PORT": "31000", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    prepare_environ(environ, DistEnv(3, 4, 1, 2, 1))
    assert (environ["DMLC_PS_ROOT_URI"], environ["DMLC_PS_ROOT_PORT"]) == ("127.0.0.1", "31000")
    assert environ["MASTER_PORT"] == "29500"  # torchrun's agent store keeps it
    assert (environ["DMLC_ROLE"], environ["DMLC_NUM_WORKER"], environ["DMLC_NUM_SERVER"]) == (
        "worker", "4", "1")
    assert environ["DMLC_NODE_HOST"] == "127.0.0.1"  # the route to the scheduler's address
    assert "PORT" not in environ  # ps-lite would bind every role to it
    with pytest.raises(RuntimeError, match="DLPERF_FRAMEWORK_PORT"):
        prepare_environ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                         "TORCHELASTIC_USE_AGENT_STORE": "True"}, DistEnv(0, 2, 0, 2, 0))
    environ = {"MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}  # srun, external mode
    prepare_environ(environ, DistEnv(0, 2, 0, 2, 0))
    assert (environ["DMLC_PS_ROOT_URI"], environ["DMLC_PS_ROOT_PORT"]) == ("127.0.0.1", "29500")
    with pytest.raises(RuntimeError, match="MASTER_ADDR='a{64}' does not resolve"):
        prepare_environ({"MASTER_ADDR": "a" * 64, "MASTER_PORT": "1"}, DistEnv(0, 2, 0, 2, 0))


RECIPES = """
from pytest_dlperf import Parts


def build(ctx):
    import mxnet as mx  # inside the recipe: the pytest side never imports MXNet

    width = int(ctx.sizes["width"])
    model = mx.gluon.nn.HybridSequential()
    model.add(mx.gluon.nn.Dense(2 * width, in_units=width, activation="relu"),
              mx.gluon.nn.Dense(10, in_units=2 * width))
    model.initialize(mx.init.Xavier())
    return Parts(model=model, inputs=mx.nd.random.normal(shape=(ctx.batch_size, width)),
                 targets=lambda: mx.nd.random.randint(0, 10, (ctx.batch_size,)))
"""

OWN_MODEL = """
import pytest

from pytest_dlperf import Workload

MLP = Workload("mx-mlp", recipes={"mxnet": "mx_recipes:build"}, batch_size={"cpu": 16},
               sizes={"width": 32}, unit="rows")


@pytest.mark.multinode
def test_mlp(cluster, amp, compiler, throughput_meter):
    report = throughput_meter.measure("mxnet", MLP)
    assert report.environment["data_parallel_ranks"] == cluster.world_size
    assert report.environment["parameters"] == 32 * 64 + 64 + 64 * 10 + 10
"""


@pytest.mark.outside_ci("22 s, beyond MXNet's CI share: the Slurm cluster's two-node job crosses nodes in "
                        "CI")
@pytest.mark.usefixtures("subprocess_env")
def test_an_own_model_trains_on_two_nodes(pytester: pytest.Pytester, mxnet_python: str) -> None:
    """Two local nodes (as root, two network hosts: the gradients cross the link to the
    server on the first node), op by op and hybridized, fp32 and bf16 AMP. The recipe lives in
    a module of its own: MXNet's interpreter has no pytest to import the test file with."""
    pytester.makepyfile(test_own=OWN_MODEL, mx_recipes=RECIPES)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-protocol", "quick", "-m", "multinode", "--nodes",
        "2", "--devices-per-node", "1", "--dlperf-compilers", "eager,compiled", "-k", "2n1d",
        "--dlperf-precisions", "fp32,amp", "--dlperf-json", "r.json", "--dlperf-launches", "1",
        "--dlperf-unstable-cv", "50", "--dlperf-python", f"mxnet={mxnet_python}", timeout=500)
    result.assert_outcomes(passed=4)
    benches = json.loads((pytester.path / "r.json").read_text())["benchmarks"]
    assert sorted(b["name"] for b in benches) == [
        "test_mlp[2n1d-amp-compiled]", "test_mlp[2n1d-amp-eager]",
        "test_mlp[2n1d-fp32-compiled]", "test_mlp[2n1d-fp32-eager]"]
    for bench in benches:
        info = bench["extra_info"]
        assert info["fingerprint"]["framework"] == "mxnet" and info["unit"] == "rows"
        assert info["environment"]["compiled"] == bench["name"].endswith("compiled]")
        assert info["environment"]["kvstore"] == "dist_sync"
        ranks = info["peak_memory_per_rank"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert all(r["own_step_s"] > 0 and r["peak_memory_bytes"] > 0 for r in ranks)
        # The step in phases, the push and pull left out for half the diagnostic steps, and the
        # gradients pushed and pulled alone.
        seconds = info["phases"]["seconds_per_step"]
        assert info["phases"]["communication_s"] > 0
        assert seconds["exposed communication"] >= 0
        assert all(seconds[phase] > 0 for phase in ("forward", "backward", "optimizer"))
        from pytest_dlperf.launch import fabric

        if fabric.available()[0]:
            assert len(set(info["network"]["addresses"])) == 2, info["network"]
    assert still_running_after(roles, ROLE_GRACE_S + 5) == []
