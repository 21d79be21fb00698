"""External mode: pytest itself started by torchrun on every rank (two real agents on loopback).
Rank 0 judges, reports and writes; rank 1 trains, then takes rank 0's verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_dlperf.core.ports import free_loopback_port

pytest.importorskip("torchvision")

TEST = """
import pytest

@pytest.mark.multinode
def test_s(cluster, throughput_meter):
    report = throughput_meter.measure("torch")
    print("RESULT", report.launcher, cluster.topology.id, report.result.global_batch)
"""


def launch_pytest_on_two_ranks(path: Path, tag: str, *args: str) -> tuple[list[int], list[str]]:
    port = free_loopback_port()
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr",
         "127.0.0.1", "--log-dir", str(path / f"{tag}-logs{i}"), "--redirects", "3",
         "-m", "pytest", "test_s.py", "-p", "no:cacheprovider", "-s", "-rA", "-m", "multinode",
         "--dlperf-warmup-steps", "1", "--dlperf-steps", "2", "--dlperf-repeats", "1",
         "--dlperf-baselines", "bl", "--dlperf-json", f"{tag}.json", *args],
        cwd=path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    codes = [agent.wait(timeout=240) for agent in agents]
    outputs = {}
    for log in path.glob(f"{tag}-logs*/*/attempt_0/0/stdout.log"):
        text = log.read_text()
        rank = 0 if "pytest-dlperf: training throughput" in text else 1
        outputs[rank] = text
    return codes, [outputs.get(0, ""), outputs.get(1, "")]


def expected_fingerprint() -> dict[str, object]:
    """What rank 0 will compute for the 2n1d case, so its baseline can exist beforehand."""
    import platform

    import torch

    from pytest_dlperf.core.allocator import Allocator
    from pytest_dlperf.core.topology import detect_hardware, fingerprint, make_topology
    from pytest_dlperf.plugin.settings import default_machine

    topology = make_topology(detect_hardware(), 2, 1, "cpu", all_nodes_here=False)
    return fingerprint(topology, framework="torch", framework_version=torch.__version__,
                       precision="fp32", model="resnet50", batch_size=2, sizes={"image_size": 64},
                       protocol_slug="w1-s2",
                       python=".".join(platform.python_version_tuple()[:2]),
                       machine=default_machine(), allocator=Allocator().label)


@pytest.mark.usefixtures("subprocess_env")
def test_rank_zero_judges_and_reports_and_the_other_rank_mirrors_it(
        pytester: pytest.Pytester) -> None:
    from pytest_dlperf.store.baselines import Baseline, BaselineStore, Metric

    pytester.makepyfile(test_s=TEST)
    # Rank 0 alone owns the baselines; one 1000x faster than any real figure here. External mode
    # has one launch per job, so its baselines are built over several jobs (=add): three here.
    BaselineStore(pytester.path / "bl").save(Baseline(
        case="test_s.py::test_s[2n1d]", fingerprint=expected_fingerprint(),
        metrics={"samples_per_s": Metric([[9999.0], [9998.0], [9997.0]], 9998.0)}))
    codes, (rank0, rank1) = launch_pytest_on_two_ranks(pytester.path, "run")
    assert all(code != 0 for code in codes), (rank0, rank1)
    for text in (rank0, rank1):  # both ranks ran the 2-node case; 1n1d cannot run here
        assert "FAILED test_s.py::test_s[2n1d]" in text
        assert "1n1d: pytest was launched as a 2-node job" in text
    assert "REGRESSION in test_s.py::test_s[2n1d]" in rank0
    assert "test_s.py::test_s[2n1d]  2 x 1" in rank0  # rank 0's table
    assert "pytest-dlperf (rank 0's verdict): pytest-dlperf: REGRESSION in" in rank1
    assert "training throughput" not in rank1
    results = json.loads((pytester.path / "run.json").read_text())  # written by rank 0 only
    (bench,) = results["benchmarks"]
    assert bench["extra_info"]["launcher"] == "external"
    assert bench["extra_info"]["topology"]["world_size"] == 2
    assert bench["extra_info"]["verdict"]["outcome"] == "regression"
    assert bench["extra_info"]["global_batch"] == 4  # both ranks' windows, aggregated


def test_a_framework_on_another_interpreter_is_refused_saying_which_launchers_can(
        tmp_path: Path) -> None:
    from pytest_dlperf.launch import LaunchError
    from pytest_dlperf.launch.external import ExternalLauncher

    launcher = ExternalLauncher({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    spec = {"framework": "oneflow", "python": "/opt/of/bin/python", "threads": 1}
    with pytest.raises(LaunchError, match=r"oneflow is set to run under /opt/of/bin/python "
                                          r"\(--dlperf-python\).*local or slurm launcher"):
        launcher.run(spec, None, tmp_path, 10)  # type: ignore[arg-type]  # refused before use


LAYOUT_TEST = """
import pytest

@pytest.mark.multinode
@pytest.mark.layouts("fsdp")
def test_s(cluster, layout, throughput_meter):
    report = throughput_meter.measure("torch", "gpt")
    print("RESULT", report.launcher, cluster.topology.id, layout.id, report.result.global_batch,
          report.environment.data_parallel_ranks)
"""


@pytest.mark.usefixtures("subprocess_env")
def test_a_layout_runs_on_the_ranks_an_outside_launcher_started(
        pytester: pytest.Pytester) -> None:
    """Issue 40: FSDP2 over the job torchrun started (the built-in GPT's small sizes): both
    ranks shard one model, each a replica of 4 sequences of 64 tokens."""
    pytester.makepyfile(test_s=LAYOUT_TEST)
    # (a CPU's scaling ladder runs dp alone unless the layouts are named: issue 74)
    codes, (rank0, rank1) = launch_pytest_on_two_ranks(pytester.path, "layout",
                                                       "--dlperf-layouts", "fsdp")
    assert codes == [0, 0], (rank0, rank1)
    for text in (rank0, rank1):
        assert "RESULT external 2n1d fsdp2 512 2" in text, text
    (bench,) = json.loads((pytester.path / "layout.json").read_text())["benchmarks"]
    assert bench["extra_info"]["layout"] == "fsdp2"
    assert bench["extra_info"]["fingerprint"]["layout"] == "fsdp2"
