"""Detection power of the regression verdict across separate launches: how often a real slowdown
is caught, and how often an unchanged workload is flagged (false alarms), when the baseline and
the judged run come from different processes started minutes apart, as they do for a user.

Usage::

    .venv/bin/python benchmarks/detection_power.py [--launches 100] [--windows 4] [--steps 10]
        [--levels 0,2,3,5,10] [--trials 2000] [--pool-out pool.json | --pool-in pool.json]

Method.

1. *Collect* (real training, real launches): ``--launches`` separate Python processes, one
   after another, each building the plugin's own torch trainer (ResNet-50 v1.5 in its CPU
   profile, fp32, SGD) through ``pytest_dlperf.rank.worker.build`` with the thread count a 1n1d case
   gets (every core). Each process warms up, times 10 single steps to calibrate its own step
   time, and times ``--windows`` windows of ``--steps`` steps through the plugin's meter. Each
   launch is assigned one slowdown level (in a random order, so the machine's drift over the
   collection hits every level alike; half the launches are 0%, which serve as baselines and as
   unchanged runs). A level of 3% busy-waits 3% of the launch's calibrated step time after every
   step (busy, not sleeping: the core stays occupied, as slower code would keep it).
2. *Judge* (resampling launches): a trial draws a baseline of B launches from the 0% launches
   and a run of L launches from a level's launches (never a launch of its own baseline), keeps
   the first K windows of each, and asks the plugin's own verdict (``decide.verdicts`` with the
   plugin's ``Policy``), adding a run's worth of launches while it is inconclusive, up to the
   policy's maximum, exactly as the meter does. The detection rate of a level is the share of
   trials judged ``regression``; at 0% that share is the false-alarm rate. For comparison, one
   row judges the same draws with every window counted as an independent sample (the unit of
   evidence of the verdict before launches: one window per "launch").

Launch cost. A design's time per case is L x (launch cost + warm-up + K windows); the launch
cost of a real case (torchrun agent, imports, process group) is measured by the plugin itself:
``--launch-cost SECONDS`` (docs/measurements/harness.md, "Repeats and launches", has the
per-framework figures).

A benchmark, not a test: it prints figures and exits 0 whatever they are.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_dlperf.store.baselines import THROUGHPUT, Baseline, Metric, Run  # noqa: E402
from pytest_dlperf.verdict.decide import Policy, verdicts  # noqa: E402
from pytest_dlperf.verdict.stats import REGRESSION, coefficient_of_variation  # noqa: E402

GOAL_DETECTION, GOAL_FALSE_ALARMS = 0.95, 0.01


def one_launch(args: argparse.Namespace) -> dict[str, Any]:
    """One launch: what a rank of a 1n1d case does, with ``args.level`` percent injected."""
    from pytest_dlperf.core.protocol import Protocol
    from pytest_dlperf.core.spec import spec_for
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.models import RESNET50
    from pytest_dlperf.rank.timing import measure
    from pytest_dlperf.rank.worker import build

    started = time.perf_counter()
    spec = spec_for("torch", RESNET50, protocol=Protocol(args.warmup, 1, 1), device_type="cpu")
    trainer = build(spec.with_(threads=args.threads), DistEnv(0, 1, 0, 1, 0))
    for _ in range(args.warmup):
        trainer.step()
    trainer.synchronize()
    calibration = []
    for _ in range(10):
        begin = time.perf_counter()
        trainer.step()
        trainer.synchronize()
        calibration.append(time.perf_counter() - begin)
    extra = statistics.median(calibration) * args.level / 100

    def step() -> None:
        trainer.step()
        if extra:
            until = time.perf_counter() + extra
            while time.perf_counter() < until:
                pass

    windows = measure(Protocol(0, args.steps, args.windows), step, trainer.synchronize).windows
    trainer.close()
    return {"level": args.level, "at": time.time(), "process_s": time.perf_counter() - started,
            "step_ms": statistics.median(calibration) * 1e3,
            "samples_per_s": [spec.batch_size * w.steps / w.elapsed_s for w in windows]}


def collect(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    others = [lv for lv in args.levels if lv != 0]
    zero = args.launches // 2 if others else args.launches  # --levels 0: unchanged only
    order = [0.0] * zero + [others[i % len(others)] for i in range(args.launches - zero)]
    rng.shuffle(order)
    launches, started = [], time.perf_counter()
    for i, level in enumerate(order):
        command = [sys.executable, __file__, "--one-launch", "--level", str(level),
                   "--windows", str(args.windows), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--threads", str(args.threads)]
        begin = time.perf_counter()
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        launch = json.loads(out.stdout.strip().splitlines()[-1])
        launch["wall_s"] = time.perf_counter() - begin
        launches.append(launch)
        if (i + 1) % 10 == 0:
            print(f"  {i + 1}/{len(order)} launches, {time.perf_counter() - started:.0f} s",
                  flush=True)
    return {"steps": args.steps, "windows": args.windows, "threads": args.threads,
            "launches": launches}


def trial(rng: random.Random, zero: list[list[float]], pool: list[list[float]], same: bool,
          design: dict[str, Any], tolerance: float, scale: float = 1.0) -> str:
    """One judged run against one baseline, grown as the meter grows it. ``scale`` multiplies
    the judged run's figures (a slowdown applied to 0% launches, for levels beyond those
    collected)."""
    b, lau, k, max_windows = design["B"], design["L"], design["K"], design["max"]
    order = rng.sample(range(len(zero)), len(zero))
    base = [zero[i][:k] for i in order[:b]]
    rest = ([[w * scale for w in zero[i]] for i in order[b:]] if same
            else rng.sample(pool, len(pool)))
    if design.get("windows_as_samples"):  # the old unit: every window its own sample
        base = [[w] for launch in base for w in launch]
    # Each baseline launch was its own process at its own time (in a random order over the
    # collection): each counts as one run of the baseline.
    baseline = Baseline("c", {}, {THROUGHPUT: Metric(base, statistics.median(
        statistics.median(x) for x in base))}, runs=[Run(None, None, None, 1) for _ in base])
    policy = Policy(tolerance=tolerance, repeats=lau * k, max_repeats=max_windows, launches=lau)
    taken = 0
    while True:
        run = [launch[:k] for launch in rest[:taken + lau]]
        taken = len(run)
        samples = [w for launch in run for w in launch]
        sizes = ([1] * len(samples) if design.get("windows_as_samples")
                 else [len(launch) for launch in run])
        verdict, _ = verdicts(samples, sizes, baseline, None, 1, tolerance, policy)
        if (verdict.outcome != "inconclusive" or not verdict.resolvable
                or len(samples) + k > max_windows
                or taken + lau > len(rest)):
            return verdict.outcome


def judge(data: dict[str, Any], args: argparse.Namespace) -> None:
    launches = data["launches"]
    by_level: dict[float, list[list[float]]] = {}
    for launch in launches:
        by_level.setdefault(float(launch["level"]), []).append(launch["samples_per_s"])
    zero = by_level[0.0]
    minutes = (max(x["at"] for x in launches) - min(x["at"] for x in launches)) / 60
    process_s = statistics.median(x["wall_s"] for x in launches)
    print(f"\n{len(launches)} launches over {minutes:.0f} min ({len(zero)} at 0%), "
          f"{data['windows']} windows of {data['steps']} steps each, step "
          f"{statistics.median(x['step_ms'] for x in launches):.1f} ms, "
          f"{process_s:.1f} s per benchmark process")
    medians = [statistics.median(x) for x in zero]
    within = statistics.median(coefficient_of_variation(x) for x in zero)
    print(f"0% launches: median {statistics.median(medians):.3f} samples/s; window CV within a "
          f"launch (median) {within:.1%}; CV of launch medians {coefficient_of_variation(medians):.1%}"
          f" (min {min(medians):.3f}, max {max(medians):.3f})")
    for level, pool in sorted(by_level.items()):
        if level:
            drop = 1 - statistics.median(statistics.median(x) for x in pool) / statistics.median(medians)
            print(f"  {level:4.0f}%: {len(pool)} launches, median drop {drop:+.1%}")
    levels = sorted(by_level)
    scaled = args.scaled
    header = ("| design | time per case | " + " | ".join(
        ("false alarms (0%)" if lv == 0 else f"caught at {lv:g}%") for lv in levels)
        + "".join(f" | {lv:g}% (scaled)" for lv in scaled) + " |")
    print(f"\ntolerance {args.tolerance:.0%}, {args.trials} trials per cell; 'scaled' levels "
          "divide 0% launches not in the baseline by 1 + level\n\n"
          f"{header}\n|" + "---|" * (len(levels) + len(scaled) + 2))
    window_s = data["steps"] * statistics.median(x["step_ms"] for x in launches) / 1e3
    for design in args.designs:
        if design["B"] + design["L"] > len(zero):
            print(f"(skipped {design['name']}: needs {design['B'] + design['L']} 0% launches)")
            continue
        rng = random.Random(args.seed)
        rates = []
        for level in levels:
            outcomes = [trial(rng, zero, by_level[level], level == 0, design, args.tolerance)
                        for _ in range(args.trials)]
            rates.append(outcomes.count(REGRESSION) / len(outcomes))
        for level in scaled:
            outcomes = [trial(rng, zero, zero, True, design, args.tolerance, 1 / (1 + level / 100))
                        for _ in range(args.trials)]
            rates.append(outcomes.count(REGRESSION) / len(outcomes))
        cost = design["L"] * (args.launch_cost + design["K"] * window_s)
        print(f"| {design['name']} | {cost:.0f} s | "
              + " | ".join(f"{r:.1%}" for r in rates) + " |", flush=True)
    print(f"\ngoal: <= {GOAL_FALSE_ALARMS:.0%} false alarms; the smallest slowdown caught "
          f">= {GOAL_DETECTION:.0%} of the time is the design's detection limit. Time per case: "
          f"launches x (launch cost {args.launch_cost:g} s + windows x {window_s:.1f} s), "
          "before any extra launches")


DESIGNS = [
    # name, baseline launches B, launches per run L, windows per launch K, max windows
    ("windows as samples (old unit): baseline 1x4, run 1x4 up to 12", 1, 1, 4, 12, True),
    ("1 launch x 4 windows, baseline 1 launch, up to 12 windows", 1, 1, 4, 12, False),
    ("2 launches x 3, baseline 2 launches, up to 18", 2, 2, 3, 18, False),
    ("2 launches x 3, baseline 6 launches (3 runs added), up to 18", 6, 2, 3, 18, False),
    ("3 launches x 2, baseline 3 launches, up to 18", 3, 3, 2, 18, False),
    ("3 launches x 2, baseline 9 launches (3 runs added), up to 18", 9, 3, 2, 18, False),
    ("2 launches x 3, baseline 12 launches (6 runs added), up to 18", 12, 2, 3, 18, False),
    ("5 launches x 1 (DLPerf), baseline 5 launches, up to 15", 5, 5, 1, 15, False),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=80, help="launches to collect")
    parser.add_argument("--windows", type=int, default=4, help="windows per launch")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per window")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--levels", default="0,2,3,5,10", help="slowdowns in percent")
    parser.add_argument("--level", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--one-launch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--scaled", default="15,20,30,50",
                        help="further slowdowns in percent, applied by scaling 0%% launches")
    parser.add_argument("--launch-cost", type=float, default=8.0,
                        help="seconds a real case's launch costs before its windows")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pool-out", type=Path, help="save the collected launches here")
    parser.add_argument("--pool-in", type=Path, help="judge launches collected earlier")
    args = parser.parse_args(argv)
    if args.one_launch:
        print(json.dumps(one_launch(args)))
        return 0
    args.levels = [float(x) for x in args.levels.split(",")]
    args.scaled = [float(x) for x in args.scaled.split(",") if x.strip()]
    if 0.0 not in args.levels:
        parser.error("--levels must include 0 (the false-alarm level)")
    data = json.loads(args.pool_in.read_text()) if args.pool_in else collect(args)
    if args.pool_out:
        args.pool_out.write_text(json.dumps(data, indent=1) + "\n")
    args.designs = [dict(name=n, B=b, L=lau, K=k, max=m, windows_as_samples=w)
                    for n, b, lau, k, m, w in DESIGNS if k <= data["windows"]]
    judge(data, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
