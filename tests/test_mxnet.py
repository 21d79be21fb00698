"""The MXNet adapter: the distributed key-value store's scheduler and server, which rank 0
starts, leaving with it; their variables; and cases under pytest. The contract every adapter
meets (two ranks average, AdamW is torch's, a window waits for MXNet's asynchronous engine) is
tests/test_conformance.py's.

MXNet runs under its own interpreter (``scripts/setup-mxnet``, or ``DLPERF_TEST_MXNET_PYTHON``):
every MXNet line here runs in a subprocess under it, and the tests skip without it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from snippets import (
    free_ports,
    still_running_after,
)

from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.frameworks.mxnet import ROLE, ROLE_GRACE_S, prepare_environ

REPO = Path(__file__).resolve().parents[1]

def roles() -> list[int]:
    """MXNet schedulers and servers the adapter started that still run."""
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if ROLE in (p.info["cmdline"] or [])]


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
