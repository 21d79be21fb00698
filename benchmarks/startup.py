"""Start-up cost: from starting pytest to the first timed step, for N local nodes x M workers.

Usage::

    .venv/bin/python benchmarks/startup.py [--nodes 4] [--devices-per-node 1] [--runs 3]
        [--framework torch] [--python FRAMEWORK=PATH]

``--framework`` picks whose ResNet-50 case starts (``mindspore`` with ``--python
mindspore=$(scripts/setup-mindspore)``: MindSpore's dynamic cluster forms inside the ranks, so
its start-up shows in "first timed step").

Each run starts ``python -m pytest`` on a generated one-case test (ResNet-50 v1.5, CPU profile,
fp32, ``-m multinode`` at exactly N nodes, no warm-up, one timed window of 2 steps) and reads the
results file: ``launched_at`` (the plugin starting the torchrun agents) and
``first_timed_step_at`` (the last rank entering its first timed step), both wall-clock epochs
taken in those processes, against the epoch just before this script started pytest. Goal: <= 15 s
for 4 nodes x 1 worker. Prints a table; exits 0 either way (non-zero only if a run fails).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 15.0
TEST = """
import pytest

@pytest.mark.multinode
def test_startup(cluster, throughput_meter):
    throughput_meter.measure(FRAMEWORK)
"""


def one_run(work: Path, nodes: int, per_node: int, index: int,
            extra: list[str]) -> tuple[float, float, float]:
    out = work / f"r{index}.json"
    cmd = [sys.executable, "-m", "pytest", "test_startup.py", "-q", "-p", "no:cacheprovider",
           "-m", "multinode", "-k", f"{nodes}n{per_node}d", "--nodes", str(nodes),
           "--devices-per-node", str(per_node), "--dlperf-device", "cpu",
           "--dlperf-warmup-steps", "0", "--dlperf-steps", "2", "--dlperf-repeats", "1",
           "--dlperf-baselines", str(work / "b"), "--dlperf-json", str(out), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
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
    args = parser.parse_args(argv)
    extra = []
    if args.python:  # each run's pytest starts in a folder of its own: the path made absolute
        name, sep, path = args.python.partition("=")
        extra = ["--dlperf-python", f"{name}{sep}{Path(path).absolute()}" if sep else args.python]
    with tempfile.TemporaryDirectory(prefix="dlperf-startup-") as tmp:
        work = Path(tmp)
        (work / "test_startup.py").write_text(f"FRAMEWORK = {args.framework!r}\n" + TEST)
        rows = []
        for i in range(args.runs):
            try:
                rows.append(one_run(work, args.nodes, args.devices_per_node, i, extra))
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            print(f"run {i + 1}: pytest -> agents launched {rows[-1][0]:5.1f} s, "
                  f"-> first timed step {rows[-1][1]:5.1f} s", flush=True)
    first = statistics.median(r[1] for r in rows)
    print()
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"framework: {args.framework}; topology: {args.nodes} local nodes x "
          f"{args.devices_per_node} worker(s), CPU, "
          f"{os.cpu_count()} cores")
    print(f"{'step':<44} {'median s':>9}  runs")
    print(f"{'pytest start -> agents launched':<44} "
          f"{statistics.median(r[0] for r in rows):>9.1f}  " + ", ".join(f"{r[0]:.1f}" for r in rows))
    print(f"{'pytest start -> first timed step':<44} {first:>9.1f}  "
          + ", ".join(f"{r[1]:.1f}" for r in rows))
    print(f"goal <= {GOAL_S:g} s: {'PASS' if first <= GOAL_S else 'ABOVE'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
