"""Layouts beyond data parallelism in the OneFlow, Paddle and TensorFlow adapters (issue 40).

Real ranks train a small MLP under each layout the adapter runs, through the adapter itself,
and end at the parameters one process reaches on the same global batch, within a tolerance
relative to how far training moved them; the same parameters are far from what one process
reaches on half that batch (the control: a wrong data split would show). What an adapter cannot
run skips with its reason, through pytester as a user's perf case would.

OneFlow 0.9 (float32: its nn.Graph has no float64 momentum update on CPU) on 2 processes,
measured 2026-11-25: tensor parallel eager and nn.Graph 6e-8, a pipeline in nn.Graph 3e-8
(parameters moved 0.23); Paddle 3.3.1 (float64) tensor parallel 1e-16.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from snippets import REPO, free_ports, oneflow_job

RUNS_ONEFLOW = [
    {"name": "tp2-eager", "layout": "tp2", "compiler": "eager", "plan": "megatron"},
    {"name": "tp2-graph", "layout": "tp2", "compiler": "compiled", "plan": "megatron"},
    # One pipeline graph a process: a second one in the same process hung here.
    {"name": "pp2-graph", "layout": "pp2-mb4", "compiler": "compiled", "plan": "megatron"},
    {"name": "pp2-eager", "layout": "pp2", "compiler": "eager", "plan": "megatron"},
    {"name": "fsdp2-graph", "layout": "fsdp2", "compiler": "compiled", "plan": "megatron"},
]


def rank_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
            "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2", "TF_CPP_MIN_LOG_LEVEL": "2",
            **extra}


def check_trained_alike(results: dict[str, Any], name: str, relative: float) -> None:
    """The layout's parameters within ``relative`` of how far training moved them from one
    process's on the global batch, and at least 100 times that from one process's on half of
    it."""
    run = results[name]
    assert "error" not in run, run
    tolerance = relative * run["moved"]
    assert run["moved"] > 0.01, run  # training moved them: a comparison worth making
    assert run["diff"] <= tolerance, (name, run)
    assert run["diff_half_batch"] > 100 * tolerance, (name, run)


def test_oneflow_tensor_parallel_and_pipelines_train_as_one_process(
        oneflow_python: str, tmp_path: Path) -> None:
    """OneFlow's own launcher starts the two ranks; one job runs every layout (its start-up
    costs several seconds here). Eager pipelines and ZeRO refuse themselves in the rank too,
    where a caller did not ask layout_unavailable first."""
    oneflow_job(oneflow_python, [str(REPO / "tests" / "layouts_frameworks_oneflow_rank.py"),
                                 str(tmp_path), json.dumps(RUNS_ONEFLOW)],
                "layouts", env=rank_env())
    results = json.loads((tmp_path / "oneflow.json").read_text())
    for name in ("tp2-eager", "tp2-graph", "pp2-graph"):
        check_trained_alike(results, name, relative=1e-5)  # float32: ~2.6e-7 of it seen
    assert "nn.Graph only" in results["pp2-eager"]["error"]
    assert "separated_header_mem_ptr" in results["fsdp2-graph"]["error"]


@pytest.mark.skipif(importlib.util.find_spec("paddle") is None,
                    reason="PaddlePaddle is not installed")
def test_paddle_tensor_parallel_trains_as_one_process(tmp_path: Path) -> None:
    """Two ranks started as the plugin's launchers start them, Paddle's store on the spare
    port; Megatron's column-then-row plan through the auto-parallel API in float64. A plan that
    needs a reduce-scatter fails on CPU, and to_static is refused, saying why."""
    runs = [{"name": "tp2", "layout": "tp2", "compiler": "eager", "plan": "megatron"},
            {"name": "tp2-colwise", "layout": "tp2", "compiler": "eager", "plan": "colwise"},
            {"name": "tp2-compiled", "layout": "tp2", "compiler": "compiled",
             "plan": "megatron"}]
    master, spare = free_ports(2)
    ranks = [subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "layouts_frameworks_paddle_rank.py"),
         str(tmp_path), json.dumps(runs)],
        env=rank_env(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(master), DLPERF_FRAMEWORK_PORT=str(spare)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        stdin=subprocess.DEVNULL) for rank in (0, 1)]
    for proc in ranks:
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
    results = json.loads((tmp_path / "paddle.json").read_text())
    check_trained_alike(results, "tp2", relative=1e-9)
    assert "CReduceScatterOp" in results["tp2-colwise"]["error"]
    assert "to_static" in results["tp2-compiled"]["error"]


UNAVAILABLE = """
import pytest
from pytest_dlperf import Workload

MLP = Workload("mlp", recipes={"oneflow": "nowhere:build", "paddle": "nowhere:build",
                               "tensorflow": "nowhere:build"},
               layouts=("dp", "fsdp", "tp", "pp"))


@pytest.mark.parametrize("framework", ["oneflow", "paddle", "tensorflow"])
def test_mlp(cluster, compiler, layout, framework, throughput_meter):
    throughput_meter.measure(framework, MLP)
"""


@pytest.mark.usefixtures("subprocess_env")
def test_layouts_an_adapter_cannot_run_skip_with_its_reason(
        pytester: pytest.Pytester, oneflow_python: str) -> None:
    pytester.makepyfile(test_unavailable=UNAVAILABLE)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--devices-per-node", "2", "--dlperf-layouts",
        "fsdp2,pp2,tp2", "--dlperf-compilers", "eager,compiled", "-rs", "--dlperf-python",
        f"oneflow={oneflow_python}", "-k",
        "(oneflow and (fsdp2 or (pp2 and eager))) or (paddle and not (tp2 and eager)) "
        "or tensorflow", timeout=120)
    result.assert_outcomes(skipped=3 + 5 + 6)  # oneflow fsdp2 x 2 and pp2 eager
    result.stdout.fnmatch_lines_random([
        "*oneflow cannot run layout fsdp2*ZeRO*aborts on CPU*separated_header_mem_ptr*",
        "*oneflow cannot run layout pp2*nn.Graph only*",
        "*paddle cannot run layout pp2*gloo*does not support send*",
        "*paddle cannot run layout fsdp2*CReduceScatterOp*",
        "*paddle cannot run layout tp2*to_static*",
        "*tensorflow cannot run layout tp2*Keras 3*prototype*",
    ])
