"""Slurm mode against a faked allocation: the real plugin, launcher, torchrun agents and workers;
only ``srun``/``scontrol`` and the SLURM_* environment are fakes (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_dlperf.launch.slurm import expand_nodelist

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
def test_scale(cluster, throughput_meter):
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
# TF: TF_CONFIG through the store. OneFlow: its own interpreter and control-plane port, and the
# fake allocation lists this host twice, so its ranks must be numbered as one host's.
@pytest.mark.parametrize("framework", ["torch", "tensorflow", "oneflow"])
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
