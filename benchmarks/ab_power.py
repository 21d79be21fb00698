"""Power of the A/B verdict beside the baseline verdict, on this machine, in one run: how often a
slowdown injected into the head side is caught, how often an unchanged head is flagged, and the
wall time each mode takes.

Usage::

    .venv/bin/python benchmarks/ab_power.py [--pairs-per-level 8] [--levels 0,2,3,5,10]
        [--pairs 3] [--max-pairs 6] [--tolerance 0.02] [--trials 2000]
        [--pool-out pool.json | --pool-in pool.json]

Method. 1. *Collect*: real launches, one process each, as ``detection_power.py`` makes them (the
plugin's torch trainer, ResNet-50 v1.5 in its CPU profile, every core; a level of N% busy-waits
N% of the launch's calibrated step after every step), taken as **pairs**: a base launch (0%)
and a head launch (the pair's level) right after each other, in the A/B mode's order
(base-head, head-base, ...). The levels take turns pair by pair over the whole collection, so
the machine's drift reaches every level alike.

2. *Judge* (resampling): an **A/B** trial draws ``--pairs`` pairs of one level and judges them
as the plugin does (``verdict.paired``), drawing more pairs while the verdict is inconclusive,
up to ``--max-pairs``, the false-alarm budget split over the looks. A **baseline** trial judges
head launches of a level from the second half of the collection (consecutive ones, as a run
takes them) against a baseline of base launches from its first half (minutes earlier): one run
of ``--pairs`` consecutive launches, or three such runs, with the plugin's baseline verdict
(``decide.verdicts``, by runs), judged after every launch as the meter does
(``decide.next_launches``). The rate of
``regression`` verdicts is the share caught (at 0%: false alarms). Wall time per trial: the
launches the mode used (not the baseline's own, recorded once for many runs).

A benchmark, not a test: it prints what it measures and exits 0.
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
from pytest_dlperf.verdict import paired  # noqa: E402
from pytest_dlperf.verdict.decide import Policy, next_launches, verdicts  # noqa: E402
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
    pairs, started = [], time.perf_counter()
    total = args.pairs_per_level * len(args.levels)
    for index in range(total):
        level = args.levels[index % len(args.levels)]
        made: dict[str, Any] = {}
        for side in paired.order(index // len(args.levels)):
            made[side] = launch(0.0 if side == "base" else level, args)
        pairs.append({"level": level, "at": time.time(), **made})
        if (index + 1) % len(args.levels) == 0:
            print(f"  {index + 1}/{total} pairs, {time.perf_counter() - started:.0f} s",
                  flush=True)
    return {"steps": args.steps, "windows": args.windows, "pairs": pairs}


def ab_trial(rng: random.Random, pool: list[dict[str, Any]],
             args: argparse.Namespace) -> tuple[str, float]:
    looks = 1 + -(-(args.max_pairs - args.pairs) // args.pairs)
    drawn = rng.sample(pool, min(len(pool), args.max_pairs))
    taken = args.pairs
    while True:
        used = drawn[:taken]
        verdict = paired.paired_compare(
            [(p["base"]["samples_per_s"], p["head"]["samples_per_s"]) for p in used],
            args.tolerance, alpha=look_alpha(looks))
        if verdict.outcome != INCONCLUSIVE or taken + args.pairs > len(drawn):
            return verdict.outcome, sum(p["base"]["wall_s"] + p["head"]["wall_s"] for p in used)
        taken += args.pairs


def baseline_trial(rng: random.Random, early: list[dict[str, Any]], late: list[dict[str, Any]],
                   runs: int, args: argparse.Namespace) -> tuple[str, float]:
    """A run of head launches judged against a baseline of ``runs`` runs, each run
    ``--pairs`` base launches taken back to back (as a run takes them), as the meter judges:
    after every launch, more while the verdict is not settled (``decide.next_launches``)."""
    size = args.pairs
    starts = rng.sample(range(len(early) - size + 1), runs)
    base = [x["samples_per_s"] for start in starts for x in early[start:start + size]]
    baseline = Baseline("c", {}, {THROUGHPUT: Metric(base, statistics.median(
        statistics.median(x) for x in base))}, runs=[Run(None, None, None, size)] * runs)
    k = args.windows
    policy = Policy(tolerance=args.tolerance, repeats=args.pairs * k,
                    max_repeats=args.max_pairs * k, launches=args.pairs)
    start = rng.randrange(len(late) - min(len(late), policy.max_launches) + 1)
    heads = late[start:start + policy.max_launches]
    taken = 1
    while True:
        run = heads[:taken]
        samples = [w for h in run for w in h["samples_per_s"]]
        verdict, _ = verdicts(samples, [len(h["samples_per_s"]) for h in run], baseline, None,
                              1, args.tolerance, policy)
        if not next_launches([verdict, None, None], taken, policy) or taken >= len(heads):
            return verdict.outcome, sum(h["wall_s"] for h in run)
        taken += 1


def judge(data: dict[str, Any], args: argparse.Namespace) -> None:
    pairs = data["pairs"]
    levels = sorted({p["level"] for p in pairs})
    minutes = (pairs[-1]["at"] - pairs[0]["at"]) / 60
    launches = [p[s] for p in pairs for s in ("base", "head")]
    print(f"\n{len(pairs)} pairs ({len(launches)} launches) over {minutes:.0f} min; "
          f"{data['windows']} windows of {data['steps']} steps a launch, step "
          f"{statistics.median(x['step_ms'] for x in launches):.1f} ms, "
          f"{statistics.median(x['wall_s'] for x in launches):.1f} s a launch")
    base = [statistics.median(p["base"]["samples_per_s"]) for p in pairs]
    ratios = [statistics.median(p["head"]["samples_per_s"]) / statistics.median(
        p["base"]["samples_per_s"]) for p in pairs if p["level"] == 0]
    print(f"base launches: median {statistics.median(base):.3f} samples/s (min {min(base):.3f}, "
          f"max {max(base):.3f}); 0% pairs' head/base: {', '.join(f'{r:.3f}' for r in ratios)}")
    half = len(pairs) // 2
    early = [p["base"] for p in pairs[:half]]
    rng = random.Random(args.seed)
    rows: dict[str, dict[float, list[tuple[str, float]]]] = {}
    for level in levels:
        pool = [p for p in pairs if p["level"] == level]
        late = [p["head"] for p in pairs[half:] if p["level"] == level]
        name = f"A/B, {args.pairs} pairs (up to {args.max_pairs})"
        rows.setdefault(name, {})[level] = [ab_trial(rng, pool, args) for _ in range(args.trials)]
        for runs in (1, 3):
            if not late:
                continue
            name = (f"baseline of {runs} run{'s' if runs > 1 else ''} ({runs * args.pairs} "
                    f"launches, minutes earlier), run {args.pairs} launches (up to "
                    f"{args.max_pairs})")
            rows.setdefault(name, {})[level] = [baseline_trial(rng, early, late, runs, args)
                                                for _ in range(args.trials)]
    header = " | ".join("false alarms (0%)" if lv == 0 else f"caught at {lv:g}%"
                        for lv in levels)
    print(f"\ntolerance {args.tolerance:.0%}, {args.trials} resampled trials per cell\n\n"
          f"| mode | {header} | wall time per trial (median) |\n|" + "---|" * (len(levels) + 2))
    for name, by_level in rows.items():
        cells = [f"{sum(o == REGRESSION for o, _ in got) / len(got):.1%}" if got else "-"
                 for got in (by_level.get(lv, []) for lv in levels)]
        walls = [wall for got in by_level.values() for _, wall in got]
        print(f"| {name} | " + " | ".join(cells) + f" | {statistics.median(walls):.0f} s |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs-per-level", type=int, default=8)
    parser.add_argument("--trials", type=int, default=2000, help="resampled trials per cell")
    parser.add_argument("--seed", type=int, default=1)
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
