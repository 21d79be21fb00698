"""Start-up cost: from starting pytest to the first timed step, for N local nodes x M workers.

Usage::

    .venv/bin/python benchmarks/startup.py [--nodes 4] [--devices-per-node 1] [--runs 3]
        [--framework torch] [--python FRAMEWORK=PATH] [--launcher local,ray]

``--framework`` picks whose ResNet-50 case starts (``mindspore`` with ``--python
mindspore=$(scripts/setup-mindspore)``: MindSpore's dynamic cluster forms inside the ranks, so
its start-up shows in "first timed step").

Each run starts ``python -m pytest`` on a generated one-case test (ResNet-50 v1.5, CPU profile,
fp32, ``-m multinode`` at exactly N nodes, no warm-up, one timed window of 2 steps) and reads the
results file: ``launched_at`` (the plugin starting the torchrun agents) and
``first_timed_step_at`` (the last rank entering its first timed step), both wall-clock epochs
taken in those processes, against the epoch just before this script started pytest. Goal: <= 15 s
for 4 nodes x 1 worker. Prints a table; exits 0 either way (non-zero only if a run fails).

``--launcher local,ray`` runs each launcher in turn, run after run (the machine's drift shared):
for ``ray`` a local Ray cluster of N worker nodes (``launch/ray/cluster.py``, root) is started first,
outside the timing (a Ray cluster runs before pytest does), and pytest runs on its head's host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GOAL_S = 15.0
TEST = """
import pytest

@pytest.mark.multinode
def test_startup(cluster, throughput_meter):
    throughput_meter.measure(FRAMEWORK)
"""


def one_run(work: Path, nodes: int, per_node: int, index: int,
            extra: list[str], ray: Any = None) -> tuple[float, float, float]:
    out = work / f"r{index}-{'ray' if ray else 'local'}.json"
    cmd = [sys.executable, "-m", "pytest", "test_startup.py", "-q", "-p", "no:cacheprovider",
           "-m", "multinode", "-k", f"{nodes}n{per_node}d", "--nodes", str(nodes),
           "--devices-per-node", str(per_node), "--dlperf-device", "cpu",
           "--dlperf-warmup-steps", "0", "--dlperf-steps", "2", "--dlperf-repeats", "1",
           "--dlperf-baselines", str(work / "b"), "--dlperf-json", str(out), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    if ray is not None:  # pytest on the head's host, the Ray driver
        cmd = ray.on("head", [*cmd, "--dlperf-launcher", "ray", "--dlperf-ray-address",
                              ray.address])
        env = ray.environment(env)
    started = time.time()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"run {index} failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    info = json.loads(out.read_text())["benchmarks"][0]["extra_info"]
    return (info["launched_at"] - started, info["first_timed_step_at"] - started,
            info["wall_s"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--devices-per-node", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--framework", default="torch")
    parser.add_argument("--python", default=None, metavar="FRAMEWORK=PATH",
                        help="passed on as --dlperf-python")
    parser.add_argument("--launcher", default="local",
                        help="local, ray, or both in turn (local,ray)")
    args = parser.parse_args(argv)
    launchers = args.launcher.split(",")
    if set(launchers) - {"local", "ray"}:
        parser.error(f"--launcher {args.launcher}: expected local, ray or local,ray")
    extra = []
    if args.python:  # each run's pytest starts in a folder of its own: the path made absolute
        name, sep, path = args.python.partition("=")
        extra = ["--dlperf-python", f"{name}{sep}{Path(path).absolute()}" if sep else args.python]
    with tempfile.TemporaryDirectory(prefix="dlperf-startup-") as tmp, \
            _ray_cluster("ray" in launchers, args.nodes) as ray:
        work = Path(tmp)
        (work / "test_startup.py").write_text(f"FRAMEWORK = {args.framework!r}\n" + TEST)
        rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in launchers}
        for i in range(args.runs):
            for name in launchers:
                try:
                    rows[name].append(one_run(work, args.nodes, args.devices_per_node, i, extra,
                                              ray if name == "ray" else None))
                except RuntimeError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    return 1
                print(f"run {i + 1} ({name}): pytest -> launched {rows[name][-1][0]:5.1f} s, "
                      f"-> first timed step {rows[name][-1][1]:5.1f} s", flush=True)
    print()
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"framework: {args.framework}; topology: {args.nodes} nodes x "
          f"{args.devices_per_node} worker(s), CPU, {os.cpu_count()} cores")
    print(f"{'launcher, step':<52} {'median s':>9}  runs")
    for name, runs in rows.items():
        for label, column in (("pytest start -> launched", 0),
                              ("pytest start -> first timed step", 1)):
            values = [r[column] for r in runs]
            print(f"{name + ': ' + label:<52} {statistics.median(values):>9.1f}  "
                  + ", ".join(f"{v:.1f}" for v in values))
        first = statistics.median(r[1] for r in runs)
        print(f"{name}: goal <= {GOAL_S:g} s: {'PASS' if first <= GOAL_S else 'ABOVE'}")
    return 0


@contextlib.contextmanager
def _ray_cluster(wanted: bool, nodes: int) -> Iterator[Any]:
    """A local Ray cluster of ``nodes`` worker nodes while the runs last (None: not wanted)."""
    if not wanted:
        yield None
        return
    from pytest_dlperf.launch.ray.cluster import LocalRay

    cluster = LocalRay(Path(tempfile.mkdtemp(prefix="dlpr-", dir="/tmp")), nodes=nodes)
    cluster.start()
    print(f"a local Ray cluster of {nodes} node(s) started in {cluster.timings['start_s']:.1f} s"
          " (not timed)", flush=True)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.state_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
