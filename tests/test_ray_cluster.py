"""Ray mode on a real Ray cluster on this machine (``launch/localray.py``): a head and two worker
nodes, each its own network host (namespace, address). pytest runs on the head's host, the Ray
driver, as on a real cluster's head node, and the plugin places one actor per rank
(``launch/ray.py``). Then faults, done to the real thing: a rank killed, a node's raylet killed,
pytest interrupted and killed. Nothing here fakes Ray; it needs root and Ray (skips saying so)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_slurm_cluster import RECIPES, SCALING, framework_args, wait_for

from pytest_dlperf.launch import fabric, localray
from pytest_dlperf.launch.localray import LocalRay

_OK, _WHY = localray.available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"no local Ray cluster here: {_WHY}")
REPO = Path(__file__).resolve().parents[1]
PROTOCOL = ("--dlperf-warmup-steps", "1", "--dlperf-repeats", "1", "--dlperf-launches", "1")
# What a driver on the head sees of the plugin's placement groups and actors: those not yet
# removed, and the named actors still alive.
LEFT = """
import json, ray
ray.init(address="auto", namespace="pytest-dlperf", log_to_driver=False, logging_level="ERROR")
groups = [g["name"] for g in ray.util.placement_group_table().values()
          if g["name"].startswith("dlperf-") and g["state"] != "REMOVED"]
actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
          if a["name"].startswith("dlperf-")]
print(json.dumps({"groups": groups, "actors": actors}))
"""


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[LocalRay]:
    """A head and two worker nodes; afterwards nothing of them may be left: no Ray process,
    namespace, link or route."""
    state = Path(tempfile.mkdtemp(prefix="dlpr-", dir="/tmp"))
    cluster = LocalRay(state, nodes=2)
    cluster.start()
    made = {"namespaces": {h.namespace for h in cluster.hosts.values()},
            "links": {h.veth for h in cluster.hosts.values()}}
    print(f"\nlocal Ray: started in {cluster.timings['start_s']:.2f} s {cluster.timings}")
    try:
        yield cluster
    finally:
        cluster.stop()
        print(f"\nlocal Ray: stopped in {cluster.timings['stop_s']:.2f} s")
        left = fabric.leftovers()
        assert not made["namespaces"] & set(left["namespaces"])
        assert not made["links"] & set(left["links"])
        assert ray_processes(state) == []
        shutil.rmtree(state, ignore_errors=True)


def ray_processes(state: Path) -> list[str]:
    """The processes of the cluster at ``state`` (their command lines name its folder)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if str(state) in line and proc.info["pid"] != os.getpid():
            found.append(f"{proc.info['pid']} {line[:160]}")
    return found


def left_on(cluster: LocalRay) -> dict[str, list[str]]:
    """The plugin's placement groups and actors the cluster still holds, and the ranks and
    actors' processes still on its nodes."""
    done = subprocess.run(cluster.on("head", [sys.executable, "-c", LEFT]), capture_output=True,
                          text=True, env=cluster.environment(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    seen["processes"] = [line for lines in cluster.busy().values() for line in lines]
    return seen


def assert_nothing_left(cluster: LocalRay, timeout_s: float = 30.0) -> float:
    """Within ``timeout_s``: no placement group, actor or rank of the plugin's on the cluster.
    Returns the seconds it took."""
    began = time.monotonic()
    seen: dict[str, list[str]] = {}

    def empty() -> bool:
        seen.update(left_on(cluster))
        return not any(seen.values())

    assert wait_for(empty, timeout_s, 0.5), f"still there after {timeout_s:g} s: {seen}"
    return time.monotonic() - began


def netns_inode(host: fabric.Host) -> str:
    return f"net:[{os.stat(host.netns_path).st_ino}]"


class Run:
    """A pytest run on the head's host, the Ray launcher placing its ranks on the cluster."""

    def __init__(self, cluster: LocalRay, folder: Path, framework: str, args: list[str],
                 sleep_s: float = 0.0, files: dict[str, str] | None = None) -> None:
        self.cluster, self.folder = cluster, folder
        for name, text in (files or {"mlp_recipes.py": RECIPES,
                                     "test_scale.py": f"FRAMEWORK = {framework!r}\n{SCALING}"}
                           ).items():
            (folder / name).write_text(text)
        self.where = folder / "where"
        self.where.mkdir(exist_ok=True)
        self.output = folder / "pytest.out"
        self.pytest = [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider",
                       "--dlperf-launcher", "ray", "--dlperf-ray-address", cluster.address,
                       "--dlperf-json", str(folder / "results.json"), *args]
        self.env = cluster.environment()
        self.env.update(RANKS_WHERE=str(self.where), RANKS_SLEEP=str(sleep_s))

    def start(self) -> subprocess.Popen[bytes]:
        with open(self.output, "wb") as out:
            return subprocess.Popen(self.cluster.on("head", self.pytest), cwd=self.folder,
                                    env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def ranks(self, timeout_s: float = 120.0) -> dict[int, dict[str, Any]]:
        """Where the two ranks of the 2n1d case run, once both have taken a step."""
        found = wait_for(lambda: len(list(self.where.glob("w2-r*.json"))) == 2, timeout_s)
        assert found, f"the ranks did not start within {timeout_s:g} s:\n{self.text()}"
        return {int(p.stem.split("-r")[1]): json.loads(p.read_text())
                for p in self.where.glob("w2-r*.json")}

    def case(self, topology: str = "2n1d") -> dict[str, Any]:
        results = json.loads((self.folder / "results.json").read_text())
        [info] = [b["extra_info"] for b in results["benchmarks"]
                  if b["extra_info"]["topology"]["id"] == topology]
        return dict(info)


TWO_NODES = ["-m", "multinode", "--nodes", "2", "--devices-per-node", "1", "-k", "2n1d",
             *PROTOCOL]


@pytest.mark.usefixtures("subprocess_env")
@pytest.mark.parametrize("framework", ["torch", "oneflow"])
def test_an_own_model_trains_one_rank_on_each_ray_node(
        ray_cluster: LocalRay, pytester: pytest.Pytester, request: pytest.FixtureRequest,
        framework: str) -> None:
    """torch in pytest's interpreter, OneFlow under its own (Python 3.10), each rank an actor's
    process on its own node, the results back through Ray, the link between them measured."""
    run = Run(ray_cluster, pytester.path, framework,
              [*TWO_NODES, "--dlperf-steps", "2", "--dlperf-timeout", "180",
               *framework_args(framework, request)])
    began = time.monotonic()
    done = run.start().wait(timeout=400)
    print(f"\n{framework} through Ray: {time.monotonic() - began:.1f} s")
    assert done == 0, run.text()
    assert "1 passed" in run.text()
    case = run.case()
    assert case["launcher"] == "ray" and case["framework"] == framework
    assert case["topology"]["world_size"] == 2 and case["environment"]["data_parallel_ranks"] == 2
    network = case["network"]
    nodes = [ray_cluster.hosts[name] for name in ray_cluster.node_names]
    assert sorted(network["addresses"]) == sorted(h.address for h in nodes), network
    assert network["measured_bps"] > 0, network
    ranks = run.ranks(timeout_s=0)
    # Each rank in its own node's network namespace, none on the head's
    assert sorted(r["netns"] for r in ranks.values()) == sorted(netns_inode(h) for h in nodes)
    assert all(r["pid"] != os.getpid() for r in ranks.values())
    # The case's scratch never held the ranks' results: they came back through Ray
    assert_nothing_left(ray_cluster)


@pytest.mark.usefixtures("subprocess_env")
def test_the_built_in_resnet50_case_runs_on_two_ray_nodes(ray_cluster: LocalRay,
                                                          tmp_path: Path) -> None:
    """perf_tests' own torch ResNet-50 case (CI's profile) on 2 nodes x 1 device."""
    run = Run(ray_cluster, tmp_path, "torch", [
        str(REPO / "perf_tests"), "--rootdir", str(REPO), "-m", "multinode", "--nodes", "2",
        "--devices-per-node", "1", "-k", "resnet50 and torch and fp32 and eager and 2n1d",
        "--dlperf-protocol", "quick", "--dlperf-repeats", "1", "--dlperf-baselines",
        str(tmp_path / "bl")], files={})
    done = run.start().wait(timeout=600)
    assert done == 0, run.text()[-6000:]
    case = run.case()
    assert case["launcher"] == "ray" and case["model"] == "resnet50"
    assert case["samples_per_s"] > 0
    assert case["network"]["measured_bps"] > 0


def test_more_nodes_than_the_cluster_has_is_a_usage_error_naming_its_nodes(
        ray_cluster: LocalRay, pytester: pytest.Pytester) -> None:
    run = Run(ray_cluster, pytester.path, "torch", ["-m", "multinode", "--nodes", "3",
                                                    "--devices-per-node", "1"])
    done = run.start().wait(timeout=120)
    assert done == pytest.ExitCode.USAGE_ERROR, run.text()
    text = " ".join(run.text().split())
    assert "--nodes=3 with --devices-per-node=1 needs 3 Ray node(s)" in text, text
    for name in ray_cluster.node_names:
        assert f"{name} ({ray_cluster.hosts[name].address})" in text
    assert "pass --nodes 2 or fewer" in text


@pytest.mark.parametrize("args, says", [
    ([], "--dlperf-launcher=ray needs a running Ray cluster's address: --dlperf-ray-address"),
    (["--dlperf-ray-address", "10.0.0.1"], "bad value for --dlperf-ray-address=10.0.0.1: "
     "expected a Ray cluster's address, HOST:PORT of its GCS"),
])
def test_ray_without_a_cluster_address_is_a_usage_error(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str],
        says: str) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dlperf-launcher", "ray",
                                           *args, timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{says}*"])


def test_a_cluster_that_does_not_answer_is_a_usage_error(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GCS address where nothing listens (loopback: nothing leaves this machine)."""
    from pytest_dlperf.core.ports import free_loopback_port

    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_loopback_port()}")
    pytester.makepyfile("def test_x(): pass")
    began = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dlperf-launcher", "ray",
                                           timeout=300)
    print(f"\nrefused after {time.monotonic() - began:.1f} s")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dlperf-launcher=ray: cannot connect to the Ray cluster at "
                                 "'127.0.0.1:*"])
