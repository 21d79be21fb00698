"""Detection power of the regression verdict on this machine: how often a real slowdown is caught,
and how often an unchanged workload is flagged (false alarms).

Usage::

    .venv/bin/python benchmarks/detection_power.py [--windows 30] [--steps 20] [--threads N]
        [--levels 0,2,3,5,10] [--trials 1000] [--pool-out pool.json | --pool-in pool.json]

Method.

1. *Collect* (real training): one process builds the plugin's own torch trainer (ResNet-50 v1.5,
   the CPU profile: 64x64 images, batch 2, fp32, SGD) with the thread count a 1n1d case gets
   (every core), warms up, and calibrates the median step time. It then times ``--windows``
   windows of ``--steps`` steps for every slowdown level, through the plugin's meter. A level of
   3% busy-waits 3% of the calibrated step time after every step (busy, not sleeping: the core
   stays occupied, as slower code would keep it). Windows of all levels are interleaved in a
   random order so that the machine's slow drift hits every level alike.
2. *Judge* (resampling): a trial draws a baseline of ``repeats`` windows from the 0% pool and a
   candidate of ``repeats`` windows from a level's pool (never the same windows as its baseline),
   and asks ``pytest_dlperf.stats.compare`` for the verdict exactly as the plugin does: while it
   is inconclusive and fewer than ``max_repeats`` candidate windows were drawn, ``repeats`` more
   are added. A design ``B:R:M`` has a baseline of B windows (recorded with
   ``--dlperf-repeats B``), runs of R windows, grown up to M (``--dlperf-max-repeats M``). The detection rate of a level is the share of trials judged ``regression``; at 0%
   that share is the false-alarm rate.

What this does not capture: the offset between two separate runs (a baseline recorded on another
day). Interleaving removes it on purpose, so these rates are the best the verdict can do on this
machine's window-to-window noise; separate runs can only be noisier.

A benchmark, not a test: it prints figures and exits 0 whatever they are.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_dlperf.stats import (INCONCLUSIVE, REGRESSION, coefficient_of_variation,  # noqa: E402
                                 compare, look_alpha)

GOAL_DETECTION, GOAL_FALSE_ALARMS, GOAL_LEVEL = 0.95, 0.01, 3.0


def collect(args: argparse.Namespace) -> dict[str, Any]:
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.meter import measure
    from pytest_dlperf.models import RESNET50
    from pytest_dlperf.protocol import Protocol
    from pytest_dlperf.spec import spec_for
    from pytest_dlperf.worker import build

    spec = spec_for("torch", RESNET50, protocol=Protocol(args.warmup, 1, 1), device_type="cpu",
                    batch_size=args.batch_size, sizes={"image_size": args.image_size})
    trainer = build(spec.with_(threads=args.threads), DistEnv(0, 1, 0, 1, 0))
    for _ in range(args.warmup):
        trainer.step()
    calibration = []
    for _ in range(20):
        begin = time.perf_counter()
        trainer.step()
        calibration.append(time.perf_counter() - begin)
    step_s = statistics.median(calibration)
    print(f"calibrated step: {step_s * 1e3:.1f} ms ({args.threads} threads, "
          f"{args.image_size}x{args.image_size}, batch {args.batch_size})", flush=True)

    order = [level for level in args.levels for _ in range(args.windows)]
    random.Random(args.seed).shuffle(order)
    pools: dict[str, list[float]] = {str(level): [] for level in args.levels}
    started = time.perf_counter()
    for i, level in enumerate(order):
        extra = step_s * level / 100

        def step(extra: float = extra) -> None:
            trainer.step()
            if extra:
                until = time.perf_counter() + extra
                while time.perf_counter() < until:
                    pass

        window = measure(Protocol(0, args.steps, 1), step, trainer.synchronize).windows[0]
        pools[str(level)].append(args.batch_size * args.steps / window.elapsed_s)
        if (i + 1) % 25 == 0:
            print(f"  {i + 1}/{len(order)} windows, {time.perf_counter() - started:.0f} s",
                  flush=True)
    trainer.close()
    return {"step_ms": step_s * 1e3, "steps": args.steps, "threads": args.threads,
            "image_size": args.image_size, "batch_size": args.batch_size, "pools": pools}


def trial(rng: random.Random, base_pool: list[float], pool: list[float], same: bool,
          tolerance: float, base_size: int, repeats: int, max_repeats: int) -> str:
    indices = rng.sample(range(len(base_pool)), len(base_pool))
    baseline = [base_pool[i] for i in indices[:base_size]]
    if same:  # the 0% level: the candidate never reuses its baseline's windows
        rest = [base_pool[i] for i in indices[base_size:]]
    else:
        rest = rng.sample(pool, len(pool))
    drawn = repeats
    alpha = look_alpha(1 + -(-(max_repeats - repeats) // repeats))  # as the plugin splits it
    while True:
        verdict = compare(rest[:drawn], baseline, tolerance, alpha=alpha)
        if verdict.outcome != INCONCLUSIVE or drawn >= max_repeats or drawn >= len(rest):
            return verdict.outcome
        drawn += repeats


def judge(data: dict[str, Any], args: argparse.Namespace) -> None:
    pools = {float(k): v for k, v in data["pools"].items()}
    base_pool = pools[0.0]
    print(f"\nwindows: {data['steps']} steps, step {data['step_ms']:.1f} ms, "
          f"{len(base_pool)} per level; trials per cell: {args.trials}")
    for level, pool in sorted(pools.items()):
        print(f"  {level:4.0f}%: median {statistics.median(pool):7.3f} samples/s, "
              f"window CV {coefficient_of_variation(pool):.1%}, "
              f"median drop {1 - statistics.median(pool) / statistics.median(base_pool):+.1%}")
    levels = sorted(pools)
    header = "| rule | " + " | ".join(
        ("false alarms (0%)" if lv == 0 else f"caught at {lv:g}%") for lv in levels) + " |"
    print("\n" + header + "\n|" + "---|" * (len(levels) + 1))
    for tolerance in args.tolerances:
        for base_size, repeats, max_repeats in args.designs:
            if base_size + max_repeats > len(base_pool):
                print(f"(skipped {base_size}:{repeats}:{max_repeats}: needs "
                      f"{base_size + max_repeats} windows of 0%, have {len(base_pool)})")
                continue
            rng = random.Random(args.seed)
            rates = []
            for level in levels:
                outcomes = [trial(rng, base_pool, pools[level], level == 0, tolerance, base_size,
                                  repeats, max_repeats) for _ in range(args.trials)]
                rates.append(outcomes.count(REGRESSION) / len(outcomes))
            more = f", up to {max_repeats}" if max_repeats > repeats else ""
            rule = (f"tolerance {tolerance:.0%}: baseline {base_size}, run {repeats}{more}")
            print(f"| {rule} | " + " | ".join(f"{r:.1%}" for r in rates) + " |", flush=True)
    print(f"\ngoal: >= {GOAL_DETECTION:.0%} caught at {GOAL_LEVEL:g}% with <= "
          f"{GOAL_FALSE_ALARMS:.0%} false alarms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=30, help="windows per slowdown level")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per window")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--levels", default="0,2,3,5,10", help="slowdowns in percent")
    parser.add_argument("--tolerances", default="0.01,0.05")
    parser.add_argument("--designs", default="7:7:7,7:7:21,21:7:21",
                        help="baseline_repeats:repeats:max_repeats triples, comma-separated "
                             "(the plugin's defaults are 7:7:21)")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pool-out", type=Path, help="save the collected windows here")
    parser.add_argument("--pool-in", type=Path, help="judge windows collected earlier")
    args = parser.parse_args(argv)
    args.levels = [float(x) for x in args.levels.split(",")]
    args.tolerances = [float(x) for x in args.tolerances.split(",")]
    try:
        args.designs = [tuple(int(v) for v in d.split(":")) for d in args.designs.split(",")]
        assert all(len(d) == 3 and min(d) >= 1 and d[2] >= d[1] for d in args.designs)
    except (ValueError, AssertionError):
        parser.error(f"--designs: expected B:R:M triples with M >= R >= 1, got {args.designs!r}")
    if 0.0 not in args.levels:
        parser.error("--levels must include 0 (the false-alarm level)")
    data = json.loads(args.pool_in.read_text()) if args.pool_in else collect(args)
    if args.pool_out:
        args.pool_out.write_text(json.dumps(data, indent=1) + "\n")
    judge(data, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
