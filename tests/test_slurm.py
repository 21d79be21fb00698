"""Slurm mode against a faked allocation: the real plugin, launcher, torchrun agents and workers;
only ``srun``/``scontrol`` and the SLURM_* environment are fakes (tests/conftest.py). What a
real Slurm cluster shows is in tests/test_slurm_cluster.py; here is what it cannot: usage errors
without Slurm, one host listed twice in an allocation, srun's exact command lines."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_dlperf.launch import LaunchError
from pytest_dlperf.launch.slurm import expand_nodelist, with_nodes

REPO = Path(__file__).resolve().parents[1]

# A small MLP in each framework, in a module of its own: OneFlow's ranks import the recipes'
# module under their own Python, which has no pytest. What these tests check (srun's command
# lines, TF_CONFIG through the store, OneFlow's numbering of ranks on a shared host) does not
# depend on the model, and ResNet-50's build took most of a launch here (TensorFlow's: ~20 s of
# two ranks on two cores).
RECIPES = """
from pytest_dlperf import Parts, Workload


def torch_mlp(ctx):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, 32),
                 targets=lambda: torch.randint(0, 10, (ctx.batch_size,)))


def tensorflow_mlp(ctx):
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, "relu"),
                              keras.layers.Dense(10)])
    return Parts(model=model, inputs=tf.random.normal((ctx.batch_size, 32)),
                 targets=lambda: tf.random.uniform((ctx.batch_size,), 0, 10, tf.int32))


def oneflow_mlp(ctx):
    import oneflow as flow

    model = flow.nn.Sequential(flow.nn.Linear(32, 64), flow.nn.ReLU(), flow.nn.Linear(64, 10))
    return Parts(model=model, inputs=flow.randn(ctx.batch_size, 32),
                 targets=lambda: flow.randint(0, 10, (ctx.batch_size,)))


MLP = Workload("mlp", recipes={"torch": torch_mlp, "tensorflow": tensorflow_mlp,
                               "oneflow": oneflow_mlp}, batch_size={"cpu": 2})
"""

SCALING = """
import pytest

from mlp_recipes import MLP

FRAMEWORK = "torch"


@pytest.mark.multinode
def test_scale(cluster, layout, throughput_meter):
    report = throughput_meter.measure(FRAMEWORK, MLP)
    assert report.environment["data_parallel_ranks"] == cluster.world_size
    print("LAUNCHER", report.launcher, cluster.topology.id, report.result.global_batch)
"""


@pytest.mark.parametrize("nodelist, names", [
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("gpu[01-02,07],login1", ["gpu01", "gpu02", "gpu07", "login1"]),
    ("a,b", ["a", "b"]),
])
def test_nodelist_expansion(nodelist: str, names: list[str]) -> None:
    assert expand_nodelist(nodelist) == names


# What srun, slurmstepd and torchrun printed when rank 1 was SIGKILLed on node2 of a real
# cluster (tests/test_slurm_cluster.py), shortened.
KILLED_ON_NODE2 = """\
[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:44196.
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_00:56:27
  host      : node2
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 12682)  (SIGKILL)
srun: error: node2: task 1: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=1.0
slurmstepd-node1: error: *** STEP 1.0 ON node1 CANCELLED AT 2026-11-25T00:56:28 ***
srun: error: node1: task 0: Exited with exit code 1
"""


def test_a_failed_launch_names_the_nodes_from_what_slurm_and_torchrun_said() -> None:
    error = LaunchError("rank 1 ended (killed by SIGKILL) without a result; 1 of 2 ranks failed",
                        {0: "Connection closed by peer [127.0.0.1]:44196."}, [1], KILLED_ON_NODE2)
    named = with_nodes(error, ["node1", "node2"], unanswered=[], job_state="RUNNING")
    assert named.summary == (
        "rank 1 (on node2) ended (killed by SIGKILL) without a result; 1 of 2 ranks failed "
        "[nodes node1, node2: srun ended step 1.0 after a task failed (--kill-on-bad-exit); "
        "srun: node2 (task 1): Exited with exit code 1, node1 (task 0): Exited with exit code 1]")
    assert named.rank_errors == error.rank_errors  # loopback is no node's
    cancelled = with_nodes(LaunchError("the launcher failed before ranks [0, 1] reported",
                                       log_tail=KILLED_ON_NODE2.split("srun: error")[0]
                                       + "slurmstepd-node1: error: *** STEP 1.0 ON node1 "
                                       "CANCELLED AT 2026-11-25T00:56:28 ***\n"),
                           ["node1", "node2"], unanswered=["node2"], job_state="CANCELLED")
    assert cancelled.summary.endswith(
        "[nodes node1, node2: Slurm cancelled step 1.0 (on node1); the job is CANCELLED; srun "
        "was ending the step and heard nothing more from node2 (the node, or its slurmstepd, "
        "is gone?): ended srun]")


def test_more_nodes_than_the_allocation_is_a_usage_error(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object]) -> None:
    fake_hardware(slurm_nodes=2)
    pytester.makepyfile(test_scale=SCALING)
    result = pytester.runpytest("-m", "multinode", "--nodes", "3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--nodes=3, but Slurm allocation 4242 has 2 node(s) "
                                 "(node[[]1-2[]]); pass --nodes 2 or less*"])


def test_slurm_launcher_outside_an_allocation_is_a_usage_error(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(key, raising=False)
    pytester.makepyfile(test_scale=SCALING)
    result = pytester.runpytest("--dlperf-launcher", "slurm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dlperf-launcher=slurm, but this is not inside a Slurm "
                                 "allocation*"])


@pytest.mark.usefixtures("subprocess_env")
# The fake allocation lists this host twice, so OneFlow's ranks must be numbered as one host's:
# what a real cluster (tests/test_slurm_cluster.py, where torch, TensorFlow and OneFlow train
# through the real srun, each node its own host) cannot show.
@pytest.mark.parametrize("framework", ["oneflow"])
def test_two_node_allocation_trains_through_srun(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object], framework: str) -> None:
    # Looked up, not imported: pytester drops modules imported during a test, and importing
    # torch a second time into one process fails ("bad call flags", then a segfault).
    extra: tuple[str, ...] = ()
    if framework == "oneflow":
        python = REPO / ".venv-oneflow" / "bin" / "dlperf-python"
        if not os.access(python, os.X_OK):
            pytest.skip(f"no OneFlow interpreter at {python}: run scripts/setup-oneflow")
        extra = ("--dlperf-python", f"oneflow={python}")
    else:
        if importlib.util.find_spec(framework) is None:
            pytest.skip(f"{framework} is not installed")
    fake_hardware(slurm_nodes=2)
    pytester.makepyfile(
        mlp_recipes=RECIPES,
        test_scale=SCALING.replace('FRAMEWORK = "torch"', f'FRAMEWORK = "{framework}"'))
    result = pytester.runpytest_subprocess(
        "-s", "-p", "no:cacheprovider", "-m", "multinode", "--nodes", "2",
        "--devices-per-node", "1", "-k", "2n1d", "--dlperf-warmup-steps", "1",
        "--dlperf-steps", "2", "--dlperf-repeats", "1", "--dlperf-timeout", "150", *extra,
        timeout=300)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*LAUNCHER slurm 2n1d 4*"])
    calls = Path(os.environ["FAKE_SLURM_LOG"]).read_text().splitlines()
    # The case itself, then its 1n1d reference for the speedup (not in the session, no baseline).
    assert [c.split()[1:5] for c in calls] == [
        ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=localhost,localhost"],
        ["--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--nodelist=localhost"]]
    assert "--rdzv-endpoint localhost:" in calls[0] and "--nnodes 2" in calls[0]
    # The scratch folder is on the shared filesystem (the rootdir), and is cleaned up.
    assert (pytester.path / ".pytest-dlperf").is_dir()
    assert list((pytester.path / ".pytest-dlperf").iterdir()) == []
