"""The MXNet adapter: the distributed key-value store's scheduler and server, which rank 0
starts, leaving with it, and their variables. The contract every adapter meets (two ranks
average, AdamW is torch's, a window waits for MXNet's asynchronous engine, an own model on two
nodes) is tests/test_conformance.py's.

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
)

from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.frameworks.mxnet import prepare_environ

REPO = Path(__file__).resolve().parents[1]

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


def test_the_variables_name_the_roles_and_an_address_ps_lite_parses() -> None:
    """Where the scheduler goes is tests/test_conformance.py's (as every framework's store)."""
    environ = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "PORT": "29500",
               "DLPERF_FRAMEWORK_PORT": "31000", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    prepare_environ(environ, DistEnv(3, 4, 1, 2, 1))
    assert (environ["DMLC_ROLE"], environ["DMLC_NUM_WORKER"], environ["DMLC_NUM_SERVER"]) == (
        "worker", "4", "1")
    assert environ["DMLC_NODE_HOST"] == "127.0.0.1"  # the route to the scheduler's address
    assert "PORT" not in environ  # ps-lite would bind every role to it
    environ = {"MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}  # a host name
    prepare_environ(environ, DistEnv(0, 2, 0, 2, 0))
    assert (environ["DMLC_PS_ROOT_URI"], environ["DMLC_PS_ROOT_PORT"]) == ("127.0.0.1", "29500")
    with pytest.raises(RuntimeError, match="MASTER_ADDR='a{64}' does not resolve"):
        prepare_environ({"MASTER_ADDR": "a" * 64, "MASTER_PORT": "1"}, DistEnv(0, 2, 0, 2, 0))


def test_amp_is_refused_where_onednn_has_no_bf16_kernels() -> None:
    """MXNet 1.9.1's bf16 layers failed on an AVX2 CPU (an AMD EPYC VM, 2026-11-27: "could not
    create a primitive descriptor iterator"): its AMP cases skip there, naming what the CPU
    lacks, and run where AVX-512 core is (the VM of 2026-11-25, where they trained)."""
    from pytest_dlperf.frameworks.mxnet import cpu_bf16_unavailable

    avx2 = {"sse4_2", "avx", "avx2", "fma"}
    reason = cpu_bf16_unavailable(avx2 | {"avx512f"})
    assert reason is not None and "lacks avx512bw, avx512vl, avx512dq" in reason
    assert cpu_bf16_unavailable(avx2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}) is None
