"""Whether a case's launches are repeats of one measurement, as a new user would see it: a small
MLP of one's own in pytest sessions, launch 1 against launches 2-3 (before the FLOP count moved
after the windows, launch 1 read 1.29-1.76x the others in 15 of 15 sessions); and what the
baseline verdict then makes of an unchanged and of a ~28% slower model.

Usage::

    .venv/bin/python benchmarks/launch_alike.py [--sessions 10] [--tries 5]
        [--allocator glibc] [--steps 100]

Method. The model is the issue's (512 -> 1024 -> 512 -> 10, GELU, batch 128, torch, 1n1d fp32;
its hidden width from the environment, so that a wider model is the same case), run by
``pytest`` in a subprocess with ``--dlperf-protocol quick --dlperf-steps 100`` (3 launches of 2
windows), ``--dlperf-allocator`` as given, and ``--dlperf-json``. Nothing else should run.

1. *Sessions* (``--sessions``): each session's launch medians; launch 1's ratio to the mean of
   launches 2-3 (log scale) beside launch 2's to launch 3 (the same comparison between two
   launches nothing sets apart); the windows' noise (coefficient of variation within launches);
   whether launch 1 is within 3 standard errors of a launch median of the others' mean (the
   windows' noise alone); and ``verdict.position`` over all the sessions, the check the verdict
   runs over a baseline's runs.
2. *Tries* (``--tries``): each records 3 runs (``--dlperf-update-baselines``, then ``=add``
   twice), judges the unchanged model, then the model with a hidden width of 1536 (~28% slower
   here): each judging run's outcome, its ratio interval and the drift the verdict pooled.

A benchmark, not a test: it prints what it measures and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEST = """
import os

import torch

from pytest_dlperf import BuildContext, Parts, Workload

WIDTH = int(os.environ.get("MLP_WIDTH", "1024"))


def build(ctx: BuildContext) -> Parts:
    model = torch.nn.Sequential(torch.nn.Linear(512, WIDTH), torch.nn.GELU(),
                                torch.nn.Linear(WIDTH, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 10))
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, 512),
                 targets=torch.randint(0, 10, (ctx.batch_size,)))


MLP = Workload(name="mlp", recipes={"torch": build}, batch_size={"cpu": 128})


def test_mlp(throughput_meter):
    throughput_meter.measure("torch", MLP)
"""


def session(folder: Path, args: argparse.Namespace, *extra: str,
            width: int = 1024) -> dict[str, Any]:
    """One pytest session of the MLP; its case's results entry."""
    results = folder / f"r-{time.time_ns()}.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mlp.py",
               "--devices-per-node", "1", "--dlperf-protocol", "quick", "--dlperf-steps",
               str(args.steps), "--dlperf-allocator", args.allocator, "--dlperf-baselines",
               str(folder / "baselines"), "--dlperf-json", str(results), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    env["MLP_WIDTH"] = str(width)
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    if not results.exists():
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise SystemExit(f"the session wrote no results (exit {done.returncode})")
    [entry] = json.loads(results.read_text())["benchmarks"]
    info: dict[str, Any] = entry["extra_info"]
    return info


def sessions(args: argparse.Namespace) -> None:
    from pytest_dlperf.verdict import position
    from pytest_dlperf.verdict.stats import within_launch_cv

    print(f"\n{args.sessions} sessions ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}), "
          f"--dlperf-allocator {args.allocator}")
    print("| session | launch medians (samples/s) | launch 1 / mean of 2-3 | launch 2 / 3 | "
          "windows' noise | launch 1 within it |")
    print("|---|---|---|---|---|---|")
    runs, alike, firsts, controls = [], 0, [], []
    with tempfile.TemporaryDirectory(prefix="alike-") as tmp:
        (Path(tmp) / "test_mlp.py").write_text(TEST)
        for number in range(args.sessions):
            info = session(Path(tmp), args)
            launches = info["samples_per_s_launches"]
            runs.append(launches)
            logs = [math.log(statistics.median(launch)) for launch in launches]
            first = logs[0] - statistics.fmean(logs[1:])
            noise = within_launch_cv(launches) or 0.0
            # a launch median's standard error from its windows, and the others' mean's
            error = 1.25 * noise / math.sqrt(len(launches[0])) * math.sqrt(1 + 1 / 2)
            within = abs(first) <= 3 * error
            alike += within
            firsts.append(math.exp(first))
            controls.append(math.exp(logs[1] - logs[2]))
            print(f"| {number + 1} | {' / '.join(f'{math.exp(v):,.0f}' for v in logs)} | "
                  f"{math.exp(first):.3f} | {controls[-1]:.3f} | {noise:.1%} | "
                  f"{'yes' if within else 'no'} |", flush=True)
    print(f"\nlaunch 1 within the windows' noise of launches 2-3 in {alike} of {args.sessions}; "
          f"launch 1 / mean of 2-3: median {statistics.median(firsts):.3f} (range "
          f"{min(firsts):.3f}-{max(firsts):.3f}); launch 2 / 3: median "
          f"{statistics.median(controls):.3f} (range {min(controls):.3f}-{max(controls):.3f})")
    found = position.first_launch_apart(runs)
    print("verdict.position over the sessions: "
          + (found.describe("samples") if found else "launch 1 not apart from the others"))


def tries(args: argparse.Namespace) -> None:
    print(f"\n{args.tries} tries of: record 3 runs, judge unchanged, judge 1536 wide "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    print("| try | recorded medians | unchanged: outcome, ratio CI | 1536 wide: outcome, "
          "measured / baseline, ratio CI | the verdict's level: spread |")
    print("|---|---|---|---|---|")
    for number in range(args.tries):
        with tempfile.TemporaryDirectory(prefix="alike-") as tmp:
            folder = Path(tmp)
            (folder / "test_mlp.py").write_text(TEST)
            recorded = [session(folder, args, "--dlperf-update-baselines", how)["samples_per_s"]
                        for how in ("all", "add", "add")]
            same = session(folder, args)["verdict"]
            wider = session(folder, args, width=1536)["verdict"]

        def ci(v: dict[str, Any]) -> str:
            low_high = v.get("ratio_ci")
            return f"[{low_high[0]:.3f}, {low_high[1]:.3f}]" if low_high else "-"

        spread = wider.get("spread")
        print(f"| {number + 1} | {' / '.join(f'{r:,.0f}' for r in recorded)} | "
              f"{same['outcome']}, {ci(same)} | {wider['outcome']}, "
              f"{wider['measured'] / wider['baseline']:.3f}, {ci(wider)} | "
              f"{wider.get('level')}: {'-' if spread is None else f'{spread:.1%}'} |",
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--allocator", default="glibc")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    if args.sessions:
        sessions(args)
    if args.tries:
        tries(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
