"""The results file's machine info comes through pytest-benchmark's hooks, so a user's
``pytest_benchmark_generate_machine_info`` (and ``..._update_machine_info``) in a conftest.py
runs, as it does for pytest-benchmark's own files. Real torch training of a tiny model on one
CPU rank, in subprocess pytest runs."""

from __future__ import annotations

import json
import platform

import pytest

pytest.importorskip("torch")

CONFTEST = """
def pytest_benchmark_generate_machine_info(config):
    return {"marker": "from the conftest", "rootdir": config.rootpath.name}


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["updated"] = True
"""

TINY = """
from pytest_dlperf import Parts, Workload


def build(ctx):
    import torch  # in the ranks only (pytest's own import of it: ~4 s a run)

    return Parts(model=torch.nn.Linear(4, 2), inputs=torch.randn(ctx.batch_size, 4),
                 targets=torch.randint(0, 2, (ctx.batch_size,)))


TINY = Workload("tiny", recipes={"torch": build}, batch_size=4)


def test_tiny(cluster, throughput_meter):
    throughput_meter.measure("torch", TINY)
"""

RUN = ["-p", "no:cacheprovider", "--dlperf-protocol", "quick", "--dlperf-steps", "5",
       "--dlperf-warmup-steps", "1", "--dlperf-precisions", "fp32", "--dlperf-unstable-cv", "10",
       "-k", "1n1d", "--dlperf-json", "r.json"]


@pytest.mark.usefixtures("subprocess_env")
def test_a_conftests_machine_info_hook_fills_the_results_file(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tiny=TINY)
    pytester.makeconftest(CONFTEST)
    pytester.runpytest_subprocess(*RUN, timeout=300).assert_outcomes(passed=1)
    machine_info = json.loads((pytester.path / "r.json").read_text())["machine_info"]
    assert machine_info == {"marker": "from the conftest", "rootdir": pytester.path.name,
                            "updated": True}

    # pytest-benchmark's plugin off: no hook to call (and no conftest may implement one),
    # pytest-benchmark's own machine info all the same
    (pytester.path / "conftest.py").unlink()
    result = pytester.runpytest_subprocess(*RUN, "-p", "no:benchmark", timeout=300)
    result.assert_outcomes(passed=1)
    machine_info = json.loads((pytester.path / "r.json").read_text())["machine_info"]
    assert machine_info["node"] == platform.node() and "marker" not in machine_info
