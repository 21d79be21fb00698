"""The MindSpore adapter: its dynamic cluster's variables, the scheduler rank 0 starts leaving
with it, an AdamW that holds no memory across steps. The contract every adapter meets (two ranks
average, AdamW is torch's, a window waits for MindSpore's asynchronous CPU execution, an own
model on two nodes) is tests/test_conformance.py's.

MindSpore runs under its own interpreter (``scripts/setup-mindspore``, or
``DLPERF_TEST_MINDSPORE_PYTHON``): every MindSpore line here runs in a subprocess under it, and
the tests skip without it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from snippets import (
    free_ports,
    in_a_file,
    run_snippet,
)

from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.frameworks.mindspore import prepare_environ

REPO = Path(__file__).resolve().parents[1]

HELD = """
import json
import mindspore as ms
from pytest_dlperf.frameworks.mindspore.adamw import adamw
ms.set_context(mode=ms.PYNATIVE_MODE)
model = ms.nn.SequentialCell(ms.nn.Dense(4096, 4096), ms.nn.Dense(4096, 4))
params = list(model.trainable_params())
opt = adamw(ms)(params, [0.01 if len(p.shape) > 1 else 0.0 for p in params], 1e-4,
                (0.9, 0.999), 1e-8)
grad = ms.value_and_grad(lambda x: model(x).sum(), None, params)
x = ms.ops.randn(4, 4096)
resident = []
for _ in range(12):
    loss, grads = grad(x)
    opt(grads)
    loss.asnumpy()
    resident.append(int(open("/proc/self/statm").read().split()[1]) * 4096)
print(json.dumps(resident))
"""


def test_adamw_holds_no_memory_across_eager_steps(mindspore_python: str,
                                                  tmp_path: Path) -> None:
    """The BERT-base eager case ran out of memory in its fifth window ("Memory isn't enough
    and alloc failed, kernel name: Default/Adam"): a compiled update called from PyNative after
    ``value_and_grad`` kept a gradient-sized buffer every step (94 MB a step for a 768 x 30522
    matrix) when the AdamW was a plain Cell; as an ``nn.Optimizer``, as MindSpore's own are, it
    keeps none. Here a 64 MiB matrix over 12 steps: MindSpore's pool may still grow by a buffer
    or two (one 64 MiB step was seen), the leak grew by one every step."""
    resident = run_snippet(mindspore_python, in_a_file(HELD, tmp_path))
    assert isinstance(resident, list)
    grown = resident[-1] - resident[1]
    assert grown < 3 * 64 * 2**20, " ".join(f"{r / 2**20:.0f}" for r in resident)


ORPHAN = """
import json, os, time
from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.frameworks.mindspore import prepare_environ, start_scheduler
prepare_environ(os.environ, DistEnv(0, 2, 0, 2, 0))
print(json.dumps(start_scheduler(os.environ).pid), flush=True)
time.sleep(600)
"""


def test_the_scheduler_leaves_with_rank_0(mindspore_python: str) -> None:
    """Rank 0 killed before its workers joined (a crash, a launcher's timeout): the scheduler it
    started, waiting for workers that will never register, leaves within seconds (it waited
    for minutes, reparented to init, before it was tethered to rank 0)."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1",
           "DLPERF_FRAMEWORK_PORT": str(free_ports(1)[0])}
    rank0 = subprocess.Popen([mindspore_python, "-c", ORPHAN], stdout=subprocess.PIPE,
                             text=True, env=env, stdin=subprocess.DEVNULL)
    assert rank0.stdout is not None
    scheduler = psutil.Process(int(rank0.stdout.readline()))
    time.sleep(3)  # the scheduler under way (importing MindSpore, then serving)
    rank0.send_signal(signal.SIGKILL)
    rank0.wait()
    try:
        scheduler.wait(timeout=30)
    except psutil.TimeoutExpired:
        scheduler.kill()
        pytest.fail("rank 0's scheduler outlived it by 30 s")


def test_the_variables_name_the_rank_and_an_address_mindspore_parses() -> None:
    """Where the scheduler goes is tests/test_conformance.py's (as every framework's store)."""
    environ = {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500",
               "DLPERF_FRAMEWORK_PORT": "31000", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    prepare_environ(environ, DistEnv(3, 4, 1, 2, 1))
    assert (environ["MS_ROLE"], environ["MS_WORKER_NUM"], environ["MS_NODE_ID"]) == (
        "MS_WORKER", "4", "3")  # MindSpore's rank id is the launcher's rank
    # A host name (Slurm's MASTER_ADDR is the first node's): MindSpore parses only addresses.
    environ = {"MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}
    prepare_environ(environ, DistEnv(0, 2, 0, 2, 0))
    assert environ["MS_SCHED_HOST"] == "127.0.0.1"
    # A name that cannot be one (a 64-character label) fails before any lookup leaves the host.
    with pytest.raises(RuntimeError, match="MASTER_ADDR='a{64}' does not resolve"):
        prepare_environ({"MASTER_ADDR": "a" * 64, "MASTER_PORT": "1"}, DistEnv(0, 2, 0, 2, 0))
