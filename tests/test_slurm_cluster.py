"""Slurm mode on a real Slurm cluster on this machine (``launch/slurm/cluster.py``): munged,
slurmctld and two slurmd, each node its own network host (namespace, address, host name). pytest
runs inside a Slurm job (sbatch: on node1, the batch host; salloc: on the controller's host, the
login node) and the plugin launches the ranks with the real srun. Then faults, done to the real
thing: a rank killed, a node lost, the job cancelled, pytest killed. Nothing here fakes Slurm;
it needs root and Debian's slurmd, slurmctld, slurm-client and munge (skips saying so)."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_dlperf.launch.onehost import fabric
from pytest_dlperf.launch.slurm import cluster as localslurm
from pytest_dlperf.launch.slurm.cluster import LocalSlurm

_OK, _WHY = localslurm.available()
# The training tests share the machine (scripts/test's first pass); the faults, whose tests bound
# how soon a case ends, do not.
pytestmark = pytest.mark.skipif(not _OK, reason=f"no local Slurm cluster here: {_WHY}")

# Small MLPs; each rank writes where it runs at its first step (RANKS_WHERE), and sleeps
# RANKS_SLEEP s a step (a fault needs a case that is still running).
RECIPES = """
import json, os, socket, time
from pathlib import Path
from pytest_dlperf import Parts, Workload

_SLEEP = float(os.environ.get("RANKS_SLEEP", "0"))
_written = []


def step():
    if not _written:
        _written.append(True)
        host = socket.gethostname()
        record = {"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]),
                  "host": host, "address": socket.gethostbyname(host), "pid": os.getpid(),
                  "slurm_node": os.environ.get("SLURMD_NODENAME"),
                  "job": os.environ.get("SLURM_JOB_ID"), "netns": os.readlink("/proc/self/ns/net")}
        path = Path(os.environ["RANKS_WHERE"], f"w{record['world']}-r{record['rank']}.json")
        path.with_suffix(".tmp").write_text(json.dumps(record))
        os.replace(path.with_suffix(".tmp"), path)
    time.sleep(_SLEEP)


def torch_mlp(ctx):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    def targets():
        step()
        return torch.randint(0, 10, (ctx.batch_size,))

    return Parts(model=model, inputs=torch.randn(ctx.batch_size, 32), targets=targets)


def tensorflow_mlp(ctx):
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, "relu"),
                              keras.layers.Dense(10)])

    def targets():
        step()
        return tf.random.uniform((ctx.batch_size,), 0, 10, tf.int32)

    return Parts(model=model, inputs=tf.random.normal((ctx.batch_size, 32)), targets=targets)


def oneflow_mlp(ctx):
    import oneflow as flow

    model = flow.nn.Sequential(flow.nn.Linear(32, 64), flow.nn.ReLU(), flow.nn.Linear(64, 10))

    def targets():
        step()
        return flow.randint(0, 10, (ctx.batch_size,))

    return Parts(model=model, inputs=flow.randn(ctx.batch_size, 32), targets=targets)


def paddle_mlp(ctx):
    import paddle

    model = paddle.nn.Sequential(paddle.nn.Linear(32, 64), paddle.nn.ReLU(),
                                 paddle.nn.Linear(64, 10))

    def targets():
        step()
        return paddle.randint(0, 10, [ctx.batch_size])

    return Parts(model=model, inputs=paddle.randn([ctx.batch_size, 32]), targets=targets)


def mindspore_mlp(ctx):
    import mindspore as ms

    model = ms.nn.SequentialCell(ms.nn.Dense(32, 64), ms.nn.ReLU(), ms.nn.Dense(64, 10))

    def targets():
        step()
        return ms.ops.randint(0, 10, (ctx.batch_size,), dtype=ms.int32)

    return Parts(model=model, inputs=ms.ops.randn(ctx.batch_size, 32), targets=targets)


def mxnet_mlp(ctx):
    import mxnet as mx

    model = mx.gluon.nn.HybridSequential()
    model.add(mx.gluon.nn.Dense(64, in_units=32, activation="relu"),
              mx.gluon.nn.Dense(10, in_units=64))
    model.initialize()

    def targets():
        step()
        return mx.nd.random.randint(0, 10, (ctx.batch_size,))

    return Parts(model=model, inputs=mx.nd.random.normal(shape=(ctx.batch_size, 32)),
                 targets=targets)


def jax_mlp(ctx):
    import jax
    from flax import nnx

    rngs = nnx.Rngs(0)
    model = nnx.Sequential(nnx.Linear(32, 64, rngs=rngs), nnx.relu, nnx.Linear(64, 10, rngs=rngs))
    keys = iter(jax.random.split(jax.random.key(1 + ctx.rank), 10_000))

    def targets():
        step()
        return jax.random.randint(next(keys), (ctx.batch_size,), 0, 10)

    return Parts(model=model, inputs=jax.random.normal(next(keys), (ctx.batch_size, 32)),
                 targets=targets)


MLP = Workload("mlp", recipes={"torch": torch_mlp, "tensorflow": tensorflow_mlp,
                               "oneflow": oneflow_mlp, "paddle": paddle_mlp,
                               "mindspore": mindspore_mlp, "mxnet": mxnet_mlp, "jax": jax_mlp},
               batch_size={"cpu": 2})
"""

SCALING = """
import os, socket
from pathlib import Path

import pytest

from mlp_recipes import MLP


@pytest.mark.multinode
def test_scale(cluster, layout, throughput_meter):
    Path(os.environ["RANKS_WHERE"], "pytest.pid").write_text(str(os.getpid()))
    print("PYTEST ON", socket.gethostname())
    report = throughput_meter.measure(FRAMEWORK, MLP)
    assert report.environment["data_parallel_ranks"] == cluster.world_size
"""

PROTOCOL = ("--dlperf-warmup-steps", "1", "--dlperf-repeats", "1", "--dlperf-launches", "1")


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    """Two nodes and their controller; afterwards nothing of them may be left: no daemon, no
    process in their namespaces, no namespace, link or route."""
    # Not under pytest's temporary folder: munged runs as user munge, which must reach it.
    state = Path(tempfile.mkdtemp(prefix="dlps-", dir="/tmp"))
    cluster = LocalSlurm(state, nodes=2)
    cluster.start()
    made = {"namespaces": {h.namespace for h in cluster.hosts.values()},
            "links": {h.veth for h in cluster.hosts.values()}
            | {f"{fabric.PREFIX}{cluster.record()['fabric']}br"}}
    print(f"\nlocal Slurm: started in {cluster.timings['start_s']:.2f} s {cluster.timings}")
    try:
        yield cluster
    finally:
        cluster.stop()
        print(f"\nlocal Slurm: stopped in {cluster.timings['stop_s']:.2f} s")
        left = fabric.leftovers()
        assert not made["namespaces"] & set(left["namespaces"])
        assert not made["links"] & set(left["links"])
        assert localslurm.processes(state) == []
        assert not list(localslurm.RECORDS.glob("*.json")) or all(
            str(state) not in p.read_text() for p in localslurm.RECORDS.glob("*.json"))
        shutil.rmtree(state, ignore_errors=True)


def wait_for(what: Callable[[], Any], timeout_s: float, step_s: float = 0.1) -> Any:
    """``what()``'s first truthy answer within ``timeout_s``, else its last (falsy) one."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = what()
        if answer or time.monotonic() > deadline:
            return answer
        time.sleep(step_s)


def assert_quiet(slurm: LocalSlurm, timeout_s: float = 20.0) -> None:
    """No job left in the queue and nothing but the daemons on any host (within
    ``timeout_s``)."""
    began = time.monotonic()

    def quiet() -> bool:
        queue = subprocess.run(slurm.client(["squeue", "-h"]), capture_output=True, text=True,
                               env=slurm.environment()).stdout.strip()
        return not queue and not slurm.busy()

    if not wait_for(quiet, timeout_s, 0.2):
        left = {name: subprocess.run(["ps", "-o", "pid,cmd", "-p", ",".join(map(str, pids))],
                                     capture_output=True, text=True).stdout
                for name, pids in slurm.busy().items()}
        pytest.fail(f"still there {timeout_s:g} s after the job: {left}")
    print(f"quiet {time.monotonic() - began:.1f} s after the job")


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended; this machine's init reaps them lazily)."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


class Job:
    """A pytest run inside a Slurm job on ``slurm``: its test files in ``folder``."""

    def __init__(self, slurm: LocalSlurm, folder: Path, framework: str, args: list[str],
                 sleep_s: float = 0.0) -> None:
        self.slurm, self.folder = slurm, folder
        (folder / "mlp_recipes.py").write_text(RECIPES)
        (folder / "test_scale.py").write_text(f"FRAMEWORK = {framework!r}\n{SCALING}")
        self.where = folder / "where"
        self.where.mkdir()
        self.output = folder / "job.out"
        self.pytest = [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", "-m",
                       "multinode", "--nodes", "2", "--devices-per-node", "1", "-k", "2n1d",
                       *PROTOCOL, "--dlperf-json", str(folder / "results.json"), *args]
        self.env = slurm.environment()
        self.env.update(RANKS_WHERE=str(self.where), RANKS_SLEEP=str(sleep_s))

    def command(self, how: str) -> list[str]:
        if how == "sbatch":  # pytest on the batch host, node1
            return self.slurm.client(["sbatch", "-N", "2", "--wait", "--chdir", str(self.folder),
                                      "--output", str(self.output), "--wrap",
                                      shlex.join(self.pytest)])
        return self.slurm.client(["salloc", "-N", "2", *self.pytest])  # on ctl, the login node

    def start(self, how: str = "salloc") -> subprocess.Popen[bytes]:
        with open(self.folder / "client.out", "wb") as out:
            return subprocess.Popen(self.command(how), cwd=self.folder, env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.folder / "client.out",
                                                               self.output) if p.exists())

    def ranks(self, timeout_s: float = 120.0) -> dict[int, dict[str, Any]]:
        """Where the two ranks of the 2n1d case run, once both have taken a step."""
        found = wait_for(lambda: len(list(self.where.glob("w2-r*.json"))) == 2, timeout_s)
        assert found, f"the ranks did not start within {timeout_s:g} s:\n{self.text()}"
        return {int(p.stem.split("-r")[1]): json.loads(p.read_text())
                for p in self.where.glob("w2-r*.json")}

    def case(self) -> dict[str, Any]:
        results = json.loads((self.folder / "results.json").read_text())
        [info] = [b["extra_info"] for b in results["benchmarks"]
                  if b["extra_info"]["topology"]["id"] == "2n1d"]
        return dict(info)


def framework_args(framework: str, request: pytest.FixtureRequest) -> list[str]:
    if framework in ("oneflow", "mindspore", "mxnet", "jax"):
        python = request.getfixturevalue(f"{framework}_python")
        return ["--dlperf-python", f"{framework}={python}"]
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    return []


@pytest.mark.parametrize("framework, how, layout", [
    ("torch", "sbatch", "dp"),
    # Every framework's ranks through srun on two node hosts (19-31 s each in CI's first pass,
    # 2026-12-06), where it has an interpreter of its own (--dlperf-python) included.
    ("tensorflow", "salloc", "dp"),
    ("oneflow", "salloc", "dp"),
    ("paddle", "salloc", "dp"),
    ("mindspore", "salloc", "dp"),
    ("mxnet", "salloc", "dp"),
    # compiled: the test names no compiler, and JAX has no eager
    ("jax", "salloc", "dp"),
    # Issue 40: FSDP2 over two Slurm nodes, its all-gathers between their namespaces.
    ("torch", "salloc", "fsdp")])
@pytest.mark.usefixtures("subprocess_env")
def test_a_two_node_job_trains_one_rank_on_each_node(
        slurm: LocalSlurm, pytester: pytest.Pytester, request: pytest.FixtureRequest,
        framework: str, how: str, layout: str) -> None:
    # torch's jobs take two steps, the 2n1d launch and its 1n1d reference (issue 54, below);
    # the other frameworks' one, their ranks on the two nodes (--dlperf-speedup off; in a
    # rehearsal's first pass, 2026-12-07, TensorFlow's job took 34 s against 56 with its
    # reference's step).
    alone = () if framework == "torch" else ("--dlperf-speedup", "off")
    job = Job(slurm, pytester.path, framework,
              ["--dlperf-steps", "2", "--dlperf-timeout", "120", "--dlperf-layouts", layout,
               *alone, *framework_args(framework, request)])
    logs = slurmd_logs(slurm)
    began = time.monotonic()
    done = job.start(how).wait(timeout=400)
    print(f"\n{framework} through {how}: {time.monotonic() - began:.1f} s")
    assert done == 0, job.text()
    assert "1 passed" in job.text()
    assert f"PYTEST ON {'node1' if how == 'sbatch' else 'ctl'}" in job.text()
    case = job.case()
    assert case["launcher"] == "slurm" and case["framework"] == framework
    assert case["layout"] == {"dp": "dp", "fsdp": "fsdp2"}[layout]
    assert case["topology"]["world_size"] == 2 and case["environment"]["data_parallel_ranks"] == 2
    assert sorted(r["host"] for r in case["peak_memory_per_rank"]) == ["node1", "node2"]
    ranks = job.ranks(timeout_s=0)
    # Each rank on its own node: Slurm's name for it, its host name, its own address and
    # network namespace.
    assert sorted(r["host"] for r in ranks.values()) == ["node1", "node2"]
    for rank in ranks.values():
        assert rank["slurm_node"] == rank["host"]
        assert rank["address"] == slurm.hosts[rank["host"]].address
    assert ranks[0]["netns"] != ranks[1]["netns"]
    # The case's scratch folder (under the rootdir, which every node sees) is gone.
    assert list((pytester.path / ".pytest-dlperf").iterdir()) == []
    # Every step (the 2n1d launch, then torch's 1n1d reference) ended through its srun: had the
    # launcher killed srun once the results were in, each node's slurmstepd would have found no
    # srun to tell its tasks' exit to, retried for ~2 s, and held the step's CPUs until then and
    # until the tasks ended on their own, the next step pending behind it (issue 54).
    said = "".join(after(mark) for mark in logs)
    assert "Failed to send MESSAGE_TASK_EXIT" not in said, said[-3000:]
    assert_quiet(slurm)


def slurmd_logs(slurm: LocalSlurm) -> list[tuple[Path, int]]:
    """Each node's slurmd log and its length now: where what follows begins."""
    return [(path, path.stat().st_size) for path in
            sorted((slurm.state_dir / "log").glob("slurmd-node*.log"))
            if not path.name.endswith(".start.log")]


def after(mark: tuple[Path, int]) -> str:
    path, size = mark
    with path.open("rb") as log:
        log.seek(size)
        return log.read().decode(errors="replace")


def fault(slurm: LocalSlurm, folder: Path, do: Callable[[dict[int, dict[str, Any]]], None],
          within_s: float) -> tuple[str, dict[int, dict[str, Any]], float]:
    """A 2n1d torch case under salloc that would run ~20 s; ``do`` strikes once both ranks
    have taken a step (``strike``)."""
    job = Job(slurm, folder, "torch", ["--dlperf-steps", "400", "--dlperf-timeout", "90"],
              sleep_s=0.05)
    return strike(job, lambda ranks, _: do(ranks), within_s)


def strike(job: Any, do: Callable[[dict[int, dict[str, Any]], subprocess.Popen[bytes]], None],
           within_s: float) -> tuple[str, dict[int, dict[str, Any]], float]:
    """Start ``job`` (its ``start``, ``ranks`` and ``text``: a pytest run of a case that would
    run ~20 s), ``do`` a fault once both ranks have taken a step (given the ranks and pytest's
    process). Returns pytest's output, the ranks, and the seconds from the strike to pytest's
    end (at most ``within_s``); the case must not have passed."""
    client = job.start()
    try:
        ranks = job.ranks()
        struck = time.monotonic()
        do(ranks, client)
        client.wait(timeout=within_s + 60)
        took = time.monotonic() - struck
    finally:
        if client.poll() is None:
            client.kill()
    text: str = job.text()
    said = [line for line in text.splitlines() if line.startswith("pytest-dlperf:")]
    print(f"\nended {took:.1f} s after the fault: {said}")
    # The bounds are several times what a fault takes, so these tests share the machine
    # (scripts/test's first pass): beside two CPU hogs on both cores, 2026-12-07, a rank killed
    # ended its case 2.8 s after (bound 30), a node lost 14.7 s (srun's own wait; 40), scancel
    # 2.4 s (30), a killed pytest 0.1 s (20).
    assert took < within_s, text
    assert "1 passed" not in text
    return text, ranks, took


@pytest.mark.usefixtures("subprocess_env")
def test_a_rank_killed_fails_the_case_naming_its_node(
        slurm: LocalSlurm, pytester: pytest.Pytester) -> None:
    text, ranks, _ = fault(slurm, pytester.path,
                           lambda ranks: os.kill(ranks[1]["pid"], signal.SIGKILL), within_s=30)
    node = ranks[1]["host"]
    assert f"rank 1 (on {node}) ended (killed by SIGKILL) without a result" in text
    assert f"srun: {node} (task" in text
    assert "after a task failed (--kill-on-bad-exit)" in text and "Slurm cancelled" not in text
    assert_quiet(slurm)


@pytest.mark.usefixtures("subprocess_env")
def test_a_node_lost_fails_the_case_naming_it(
        slurm: LocalSlurm, pytester: pytest.Pytester) -> None:
    lost: list[str] = []

    def crash(ranks: dict[int, dict[str, Any]]) -> None:
        lost.append(ranks[1]["host"])
        slurm.crash(lost[0])  # slurmd, the step, the agent, the rank: all SIGKILLed at once

    try:
        text, ranks, _ = fault(slurm, pytester.path, crash, within_s=40)
        # srun was ending the step and heard nothing more from the node; rank 0's error
        # (its peer's address) names it
        assert f"heard nothing more from {lost[0]}" in text
        assert f"({lost[0]})" in text
    finally:
        if lost:
            slurm.restart(lost[0])
    assert_quiet(slurm)


@pytest.mark.usefixtures("subprocess_env")
def test_scancel_of_the_job_fails_the_case_saying_slurm_cancelled_it(
        slurm: LocalSlurm, pytester: pytest.Pytester) -> None:
    def scancel(ranks: dict[int, dict[str, Any]]) -> None:
        subprocess.run(slurm.client(["scancel", ranks[0]["job"]]), check=True,
                       env=slurm.environment())

    text, ranks, _ = fault(slurm, pytester.path, scancel, within_s=30)
    assert f"Slurm cancelled step {ranks[0]['job']}.0 (on node" in text
    assert "the job is CANCELLED" in text
    assert_quiet(slurm)


@pytest.mark.usefixtures("subprocess_env")
def test_pytest_killed_leaves_nothing_on_any_node(
        slurm: LocalSlurm, pytester: pytest.Pytester) -> None:
    def kill_pytest(ranks: dict[int, dict[str, Any]]) -> None:
        pid = int((pytester.path / "where" / "pytest.pid").read_text())
        os.kill(pid, signal.SIGKILL)

    _, ranks, _ = fault(slurm, pytester.path, kill_pytest, within_s=20)
    assert_quiet(slurm)
    assert not [r["pid"] for r in ranks.values() if running(r["pid"])]


ORPHAN = """
import subprocess, sys, time
from pathlib import Path
from pytest_dlperf.launch.slurm.cluster import LocalSlurm

cluster = LocalSlurm(Path(sys.argv[1]), nodes=1)
cluster.start()
done = subprocess.run(cluster.client(["srun", "-N1", "hostname"]), capture_output=True, text=True,
                      env=cluster.environment())
print(done.stdout.strip() or done.stderr, flush=True)
time.sleep(600)
"""


def test_a_cluster_whose_owner_was_killed_is_stopped_by_the_next_start(
        slurm: LocalSlurm, tmp_path: Path) -> None:
    """Beside the module's cluster (the same ports, each in its own namespaces), a second one
    whose owner is SIGKILLed: the next start stops its daemons and removes its hosts."""
    orphan_state = Path(tempfile.mkdtemp(prefix="dlps-", dir="/tmp"))
    next_state = Path(tempfile.mkdtemp(prefix="dlps-", dir="/tmp"))
    owner = subprocess.Popen([sys.executable, "-c", ORPHAN, str(orphan_state)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "node1"
        record = json.loads((orphan_state / localslurm.RECORD).read_text())
        namespaces = {host["namespace"] for host in record["hosts"].values()}
        assert namespaces <= set(fabric.leftovers()["namespaces"])
        ours = subprocess.run(slurm.client(["srun", "-N2", "hostname"]), capture_output=True,
                              text=True, env=slurm.environment())
        assert sorted(ours.stdout.split()) == ["node1", "node2"], ours.stderr
        owner.kill()
        owner.wait()
        assert localslurm.processes(orphan_state)  # its daemons outlive their owner
        began = time.monotonic()
        with LocalSlurm(next_state, nodes=1) as following:
            print(f"\nthe next start, sweep included: {following.timings['start_s']:.2f} s "
                  f"({time.monotonic() - began:.2f} s in all)")
        assert localslurm.processes(orphan_state) == []
        assert not namespaces & set(fabric.leftovers()["namespaces"])
        assert not (orphan_state / localslurm.RECORD).exists()
    finally:
        if owner.poll() is None:
            owner.kill()
        localslurm.sweep()
        shutil.rmtree(orphan_state, ignore_errors=True)
        shutil.rmtree(next_state, ignore_errors=True)


def dlperf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_dlperf", "slurm", *args],
                          capture_output=True, text=True, timeout=120)


def test_the_dlperf_slurm_command_starts_runs_and_stops_a_cluster() -> None:
    state = Path(tempfile.mkdtemp(prefix="dlps-", dir="/tmp"))
    try:
        started = dlperf("start", "1", "--state", str(state))
        assert started.returncode == 0, started.stderr
        assert f"dlperf slurm run --state {state} -- salloc -N 1 pytest" in started.stdout
        ran = dlperf("run", "--state", str(state), "--", "srun", "-N1", "hostname")
        assert (ran.returncode, ran.stdout.strip()) == (0, "node1"), ran.stderr
        status = dlperf("status", "--state", str(state))
        assert "slurmd-node1" in status.stdout and "GONE" not in status.stdout
        assert "'node1': 'idle'" in status.stdout
        hosts = json.loads((state / localslurm.RECORD).read_text())["hosts"].values()
        stopped = dlperf("stop", "--state", str(state))
        assert stopped.returncode == 0, stopped.stderr
        assert localslurm.processes(state) == []
        assert not {h["namespace"] for h in hosts} & set(fabric.leftovers()["namespaces"])
        again = dlperf("run", "--state", str(state), "--", "sinfo")
        assert again.returncode == 1 and "no local Slurm cluster at" in again.stderr
    finally:
        dlperf("stop", "--state", str(state))
        shutil.rmtree(state, ignore_errors=True)
