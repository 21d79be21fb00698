"""Power of the A/B verdict beside the baseline verdict, on this machine, in one run: how often a
slowdown injected into the head side is caught, how often an unchanged head is flagged, and the
wall time each mode takes.

Usage::

    .venv/bin/python benchmarks/ab_power.py [--trials 6] [--levels 0,2,3,5,10] [--pairs 3]
        [--max-pairs 6] [--tolerance 0.02] [--pool-out pool.json | --pool-in pool.json]

Method. Real launches, one process each, as ``detection_power.py`` makes them (the plugin's torch
trainer, ResNet-50 v1.5 in its CPU profile by default, every core, a level of N% busy-waiting N%
of the launch's calibrated step after every step), taken in **blocks**, one block a trial: a
block is ``--max-pairs`` pairs of launches, base (0%) and head (the block's level), in the A/B
mode's order (base-head, head-base, ...). The levels take turns block by block, so the machine's
drift over the run reaches every level alike. Each trial is judged twice, on the same launches:

- **A/B**: the block's first ``--pairs`` pairs (``verdict.paired``), more pairs while the
  verdict is inconclusive up to ``--max-pairs``, the false-alarm budget split over the looks,
  as the plugin does;
- **baseline**: the block's head launches, ``--pairs`` at a time, against a baseline of the base
  launches of an earlier block (``--pairs`` launches: one run, recorded minutes earlier) and of
  three earlier blocks (three runs), by the plugin's baseline verdict (``decide.verdicts``).

The table gives the share of trials judged a regression at each level (at 0%: false alarms),
and the median wall time per trial: every launch the mode used (a baseline's own launches not
counted: it was recorded once for many runs). A benchmark, not a test: it prints what it
measures and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_dlperf.store.baselines import THROUGHPUT, Baseline, Metric  # noqa: E402
from pytest_dlperf.verdict import paired  # noqa: E402
from pytest_dlperf.verdict.decide import Policy, verdicts  # noqa: E402
from pytest_dlperf.verdict.stats import INCONCLUSIVE, REGRESSION, look_alpha  # noqa: E402

HERE = Path(__file__).resolve().parent


def launch(level: float, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, str(HERE / "detection_power.py"), "--one-launch", "--level",
               str(level), "--windows", str(args.windows), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--threads", str(args.threads)]
    begin = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - begin
    return result


def collect(args: argparse.Namespace) -> dict[str, Any]:
    blocks, started = [], time.perf_counter()
    for trial in range(args.trials):
        for level in args.levels:
            pairs = []
            for index in range(args.max_pairs):
                made: dict[str, Any] = {}
                for side in paired.order(index):
                    made[side] = launch(0.0 if side == "base" else level, args)
                pairs.append(made)
            blocks.append({"level": level, "trial": trial, "at": time.time(), "pairs": pairs})
            print(f"  trial {trial + 1}/{args.trials}, {level:g}%: "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    return {"steps": args.steps, "windows": args.windows, "blocks": blocks}


def ab_trial(block: dict[str, Any], args: argparse.Namespace) -> tuple[str, float]:
    looks = 1 + -(-(args.max_pairs - args.pairs) // args.pairs)
    taken = args.pairs
    while True:
        used = block["pairs"][:taken]
        verdict = paired.paired_compare(
            [(p["base"]["samples_per_s"], p["head"]["samples_per_s"]) for p in used],
            args.tolerance, alpha=look_alpha(looks))
        if verdict.outcome != INCONCLUSIVE or taken + args.pairs > args.max_pairs:
            wall = sum(p["base"]["wall_s"] + p["head"]["wall_s"] for p in used)
            return verdict.outcome, wall
        taken += args.pairs


def baseline_trial(block: dict[str, Any], earlier: list[dict[str, Any]],
                   args: argparse.Namespace) -> tuple[str, float]:
    base = [p["base"]["samples_per_s"] for b in earlier for p in b["pairs"][:args.pairs]]
    baseline = Baseline("c", {}, {THROUGHPUT: Metric(base, statistics.median(
        statistics.median(x) for x in base))})
    k = args.windows
    policy = Policy(tolerance=args.tolerance, repeats=args.pairs * k,
                    max_repeats=args.max_pairs * k, launches=args.pairs)
    heads = [p["head"] for p in block["pairs"]]
    taken = args.pairs
    while True:
        run = heads[:taken]
        samples = [w for h in run for w in h["samples_per_s"]]
        verdict, _ = verdicts(samples, [len(h["samples_per_s"]) for h in run], baseline, None,
                              1, args.tolerance, policy)
        if verdict.outcome != INCONCLUSIVE or taken + args.pairs > args.max_pairs:
            return verdict.outcome, sum(h["wall_s"] for h in run)
        taken += args.pairs


def judge(data: dict[str, Any], args: argparse.Namespace) -> None:
    blocks = data["blocks"]
    levels = sorted({b["level"] for b in blocks})
    minutes = (blocks[-1]["at"] - blocks[0]["at"]) / 60
    launches = [p[s] for b in blocks for p in b["pairs"] for s in ("base", "head")]
    print(f"\n{len(blocks)} trials, {len(launches)} launches over {minutes:.0f} min; "
          f"{data['windows']} windows of {data['steps']} steps a launch, step "
          f"{statistics.median(x['step_ms'] for x in launches):.1f} ms, "
          f"{statistics.median(x['wall_s'] for x in launches):.1f} s a launch")
    zero = [statistics.median(p["base"]["samples_per_s"]) for b in blocks for p in b["pairs"]]
    print(f"base launches: median {statistics.median(zero):.3f} samples/s, min {min(zero):.3f}, "
          f"max {max(zero):.3f}")
    modes: dict[str, dict[float, list[tuple[str, float]]]] = {}
    for position, block in enumerate(blocks):
        level = block["level"]
        modes.setdefault(f"A/B, {args.pairs} pairs (up to {args.max_pairs})", {}).setdefault(
            level, []).append(ab_trial(block, args))
        for runs in (1, 3):
            # the base launches of the blocks just before this one: recorded minutes earlier
            earlier = blocks[max(0, position - runs):position]
            if len(earlier) < runs:
                continue
            name = (f"baseline of {runs} run{'s' if runs > 1 else ''} ({runs * args.pairs} "
                    f"launches), run {args.pairs} launches (up to {args.max_pairs})")
            modes.setdefault(name, {}).setdefault(level, []).append(
                baseline_trial(block, earlier, args))
    header = " | ".join("false alarms (0%)" if lv == 0 else f"caught at {lv:g}%"
                        for lv in levels)
    print(f"\ntolerance {args.tolerance:.0%}; trials per cell in brackets\n\n| mode | {header} "
          f"| wall time per trial (median) |\n|" + "---|" * (len(levels) + 2))
    for name, by_level in modes.items():
        cells = []
        for level in levels:
            got = by_level.get(level, [])
            caught = sum(outcome == REGRESSION for outcome, _ in got)
            cells.append(f"{caught}/{len(got)}" if got else "-")
        walls = [wall for got in by_level.values() for _, wall in got]
        print(f"| {name} | " + " | ".join(cells) + f" | {statistics.median(walls):.0f} s |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6, help="trials per level")
    parser.add_argument("--levels", default="0,2,3,5,10", help="slowdowns in percent")
    parser.add_argument("--pairs", type=int, default=3, help="pairs (runs' launches) per look")
    parser.add_argument("--max-pairs", type=int, default=6)
    parser.add_argument("--windows", type=int, default=2, help="windows per launch")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per window")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--pool-out", type=Path, help="save the collected launches here")
    parser.add_argument("--pool-in", type=Path, help="judge launches collected earlier")
    args = parser.parse_args(argv)
    args.levels = [float(x) for x in args.levels.split(",")]
    data = json.loads(args.pool_in.read_text()) if args.pool_in else collect(args)
    if args.pool_out:
        args.pool_out.write_text(json.dumps(data) + "\n")
    judge(data, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
