"""A launcher of one's own is a module and a hook implementation: a toy launcher, registered from
a conftest through ``pytest_dlperf_make_launcher``, trains real cases on real processes and hands
their results to pytest through its own ``collect`` (the ranks' stdout pipes, not the run
folder's files); a rank's failure travels the same way; an unknown name is a usage error naming
the registered ones. docs/adding-a-launcher.md walks through this very toy."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("subprocess_env")

# The toy, as docs/adding-a-launcher.md shows it.
TOY = '''
import json
import subprocess
import sys

from pytest_dlperf.core.ports import free_loopback_port
from pytest_dlperf.launch import Launcher, LaunchError
from pytest_dlperf.launch.processes import (
    kill_tree, one_node_environment, rank_variables, worker_environment)
from pytest_dlperf.launch.results import checked

# What each rank runs: the spec from its command line, the result to stdout, after a marker.
MARK = "toy-result: "
RANK = (
    "import json, os, sys\\n"
    "from pytest_dlperf.frameworks import DistEnv\\n"
    "from pytest_dlperf.rank.worker import rank_result\\n"
    "spec = json.loads(sys.argv[1])\\n"
    "result = rank_result(spec, DistEnv.from_environ(dict(os.environ)))\\n"
    f"print({MARK!r} + json.dumps(result), flush=True)\\n")


class ToyLauncher(Launcher):
    """One node's ranks on this host, each a process given its spec on its command line, its result read from its stdout."""

    name = "toy"
    all_nodes_here = True

    def can_run(self, topology):
        return topology.nodes == 1

    # rendezvous: the default (this host's loopback, a free port), where rank 0's store listens

    def start(self, spec, topology, run_dir, meeting, timeout_s):
        tmp = run_dir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env = worker_environment(topology, tmp, spec.get("python"), free_loopback_port(),
                                 nodes_share_host=False, allocator=spec.get("allocator"))
        env = one_node_environment(env, topology, meeting.port)
        ranks = []
        for rank in range(topology.world_size):
            log = open(run_dir / f"toy-{rank}.log", "wb")
            ranks.append(subprocess.Popen(
                [spec.get("python") or sys.executable, "-c", RANK, json.dumps(spec)],
                stdout=subprocess.PIPE, stderr=log, env={**env, **rank_variables(rank)}))
        return ranks

    def collect(self, ranks, timeout_s):
        found = {}
        for rank, process in enumerate(ranks):
            try:
                out, _ = process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise LaunchError(f"rank {rank} took over {timeout_s:g} s",
                                  missing_ranks=[rank], kind="timeout") from None
            lines = [line for line in out.decode().splitlines() if line.startswith(MARK)]
            if lines:
                found[rank] = json.loads(lines[-1][len(MARK):])
        print(f"TOY collected {len(found)} result(s) from the ranks' pipes")
        return checked(found, len(ranks), timeout_s)

    def stop(self, ranks):
        kill_tree(ranks)


def pytest_dlperf_launcher_names(config):
    return ["toy"]


def pytest_dlperf_make_launcher(config, name, environ):
    return ToyLauncher() if name == "toy" else None


def pytest_dlperf_detect_launcher(config, environ):
    return "toy" if "TOY_CLUSTER" in environ else None
'''

CASES = '''
from pytest_dlperf import Parts, Workload


def mlp(ctx):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, 64),
                 targets=lambda: torch.randint(0, 10, (ctx.batch_size,)))


def broken(ctx):
    raise ValueError("the toy's broken recipe")


MLP = Workload("mlp", recipes={"torch": mlp}, batch_size={"cpu": 8})
BROKEN = Workload("broken", recipes={"torch": broken}, batch_size={"cpu": 8})


def test_trains(cluster, throughput_meter):
    report = throughput_meter.measure("torch", MLP)
    print("TRAINED", report.launcher, cluster.topology.id, report.result.global_batch)


def test_fails(cluster, throughput_meter):
    throughput_meter.measure("torch", BROKEN)
'''

TINY = ["-p", "no:cacheprovider", "--dlperf-warmup-steps", "1", "--dlperf-steps", "2",
        "--dlperf-repeats", "1", "--dlperf-launches", "1", "--dlperf-baselines", "bl",
        "--dlperf-unstable-cv", "10", "--dlperf-straggler-threshold", "0.99"]

ONE = ["-s", "-k", "test_trains", "--devices-per-node", "1"]  # one case: test_trains[1n1d]


def test_a_toy_launcher_from_a_conftest_trains_and_hands_back_through_its_own_collect(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TOY)
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest_subprocess(
        *TINY, "-s", "-rA", "--dlperf-launcher", "toy", "--devices-per-node", "2",
        "--dlperf-json", "r.json", timeout=300)
    # Two ranks (1n2d) and one (1n1d) trained, their results read from the pipes.
    result.stdout.fnmatch_lines(["*TOY collected 1 result(s) from the ranks' pipes*",
                                 "*TRAINED toy 1n1d 8*"])
    result.stdout.fnmatch_lines(["*TOY collected 2 result(s) from the ranks' pipes*",
                                 "*TRAINED toy 1n2d 16*"])
    # A rank's error comes back the same way, and fails its case with the rank's words.
    result.stdout.fnmatch_lines(["*ValueError: the toy's broken recipe*",
                                 "*FAILED test_cases.py::test_fails[[]1n1d[]]*"])
    result.assert_outcomes(passed=2, failed=2)
    cases = json.loads((pytester.path / "r.json").read_text())["benchmarks"]
    assert {case["extra_info"]["launcher"] for case in cases} == {"toy"}
    # The toy gave its ranks no folder to write to: nothing there came back by a file.
    assert not list(pytester.path.rglob("rank-*.json"))


def test_auto_picks_the_toy_where_its_hook_claims_the_environment(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(TOY)
    pytester.makepyfile(test_cases=CASES)
    monkeypatch.setenv("TOY_CLUSTER", "1")
    claimed = pytester.runpytest_subprocess(*TINY, *ONE, timeout=300)
    claimed.stdout.fnmatch_lines(["*TOY collected 1 result(s) from the ranks' pipes*",
                                  "*TRAINED toy 1n1d 8*"])
    claimed.assert_outcomes(passed=1)
    # Not claimed: the plugin's own answer (local here).
    monkeypatch.delenv("TOY_CLUSTER")
    left = pytester.runpytest_subprocess(*TINY, *ONE, timeout=300)
    left.stdout.fnmatch_lines(["*TRAINED local 1n1d 8*"])
    left.assert_outcomes(passed=1)


def test_auto_picking_an_unlisted_name_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("def pytest_dlperf_detect_launcher(config, environ):\n"
                          "    return 'ghost'\n")
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*launcher auto (the default): pytest_dlperf_detect_launcher picked "
                                 "'ghost', which no pytest_dlperf_launcher_names lists (known: "
                                 "local, slurm, ray, external)*"])


def test_an_unknown_launcher_is_a_usage_error_naming_the_registered_ones(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TOY)
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dlperf-launcher",
                                           "kube", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*bad value for --dlperf-launcher=kube: no launcher is called 'kube' (known: auto, toy, "
        "local, slurm, ray, external)*pytest_dlperf_make_launcher*"])


def test_a_listed_name_no_hook_makes_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("def pytest_dlperf_launcher_names(config):\n    return ['ghost']\n")
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dlperf-launcher",
                                           "ghost", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'ghost' is listed by pytest_dlperf_launcher_names, but no "
                                 "pytest_dlperf_make_launcher made it*"])


# -- rank_result: a rank that carries its result itself is placed as a started one -------------

PLACED = """
import json, os, sys
from pytest_dlperf import Workload
from pytest_dlperf.core.protocol import Protocol
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.rank.worker import rank_result

sys.path.insert(0, {tests!r})
workload = Workload("linear", recipes={{"torch": "optimizer_recipes:torch"}},
                    batch_size={{"cpu": 4}}, sizes={{"loss": "zero"}})
spec = spec_for("torch", workload, protocol=Protocol(1, 2, 1), device_type="cpu",
                compiler="eager").with_(cpus=[{core}], threads=1)
result = rank_result(spec, DistEnv(0, 1, 0, 1, 0))
print(json.dumps({{"error": result.get("error"), "cpus": sorted(os.sched_getaffinity(0)),
                  "omp": os.environ.get("OMP_NUM_THREADS")}}))
"""


def test_rank_result_places_the_rank_on_the_cores_its_spec_gives(tmp_path) -> None:
    """A duet side's rank started by a launcher of another engine (Ray's actor) gets its side's
    cores and thread count, as one started by the local launcher does (``place``)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    core = max(os.sched_getaffinity(0))
    code = PLACED.format(tests=str(Path(__file__).parent), core=core)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["error"] is None
    assert found["cpus"] == [core] and found["omp"] == "1"


def test_rank_result_refuses_a_memory_limit_it_cannot_apply() -> None:
    """External mode trains in pytest's own process and a Ray actor in the actor's: neither is
    confined as a started rank is (its own cgroup, and the file that tells its OOM kill from a
    crash), so a case under a memory limit fails saying which launchers apply it, instead of
    training without it."""
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.rank.worker import rank_result

    result = rank_result({"framework": "torch", "memory_limit": 2 ** 30, "batch_size": 8},
                         DistEnv(0, 1, 0, 1, 0))
    assert result["error_type"] == "RuntimeError"
    assert "under a memory limit (--dlperf-memory-limit" in result["error"]
    assert "local or slurm launcher" in result["error"]
