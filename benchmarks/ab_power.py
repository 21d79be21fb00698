"""Power of the A/B verdict on this machine, in turns and in duet, quiet and beside CPU hogs: how
often a slowdown of the head is caught, how often an unchanged head is flagged, and the wall
time each mode takes.

Usage::

    .venv/bin/python benchmarks/ab_power.py [--pairs 20] [--hog-pairs 12] [--checked 6]
        [--trials 400] [--tolerance 0.02] [--pool-out pool.json | --pool-in pool.json]

Method. 1. *Collect* (real launches; the workload: an MLP of width 256, batch 128, timed with
the plugin's own window timer, ``rank.timing.measure``; every launch a fresh Python process on
the heap ``--allocator`` names, as the plugin's ranks start on ``--dlperf-allocator``'s):

- **turns**: a pair is a base launch and a head launch one after the other, in the A/B mode's
  order (base-head, head-base, ...), each on every core (threads = cores), as ``--dlperf-ab``
  takes them;
- **duet**: a pair is one duet launch: base and head at the same time, each pinned to its half
  of the cores (``os.sched_setaffinity``, threads = cores per half), their windows synchronized
  on the plugin's duet barrier (``rank.barrier``), the halves swapped from one pair to the next,
  as ``--dlperf-ab-mode duet`` takes them.

Both sides run the same code (an unchanged head): ``--pairs`` pairs of each mode quiet and
``--hog-pairs`` beside hogs this script starts (a ``while True`` process per core), the modes
taking turns pair by pair so the machine's drift reaches both. ``--checked`` more pairs per mode
run a head with a **real** 10% slowdown (it busy-waits 1/9 of its calibrated step after every
step), to check the synthetic levels below against a real one.

2. *Judge* (resampling, ``--trials`` per cell): a trial draws pairs of one mode and condition
and judges them as the plugin does (``verdict.paired``: the t-test and the signed-rank test, a
round of ``--per-round`` pairs per look, more rounds while inconclusive up to ``--most``, then
up to ``PAIR_LIMIT`` pairs for a slowdown every pair agrees on), every head figure multiplied by
``1 - slowdown`` (synthetic slowdowns on the measured noise; the ``--checked`` pairs say how far
a real one behaves the same). Turns judge launch medians, duet per-window log ratios. The share
of ``regression`` verdicts is the power (at 0%: the false alarms). Wall time: the pairs a trial
took, at their measured wall time.

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
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_dlperf.core import allocator  # noqa: E402
from pytest_dlperf.verdict import paired  # noqa: E402
from pytest_dlperf.verdict.stats import ALPHA, PASS, REGRESSION  # noqa: E402

LEVELS = (0.0, 0.05, 0.10, 0.20, 0.30)
BATCH, WIDTH = 128, 256


def mlp_step(width: int, threads: int) -> Callable[[], None]:
    """One SGD step of the benchmarks' MLP (width -> 4 width -> width -> 10, batch 128) on
    ``threads`` threads; ``baseline_runs`` trains it too."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                torch.nn.Linear(4 * width, width), torch.nn.GELU(),
                                torch.nn.Linear(width, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    inputs, targets = torch.randn(BATCH, width), torch.randint(0, 10, (BATCH,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return step


def one_launch(args: argparse.Namespace) -> dict[str, Any]:
    """One side of a launch: warm up, calibrate, time the windows (at the barrier in duet)."""
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})

    from pytest_dlperf.core.protocol import Protocol
    from pytest_dlperf.rank.barrier import Barrier
    from pytest_dlperf.rank.timing import measure

    train = mlp_step(WIDTH, args.threads)

    for _ in range(args.warmup):
        train()
    calibration = []
    for _ in range(10):
        begin = time.perf_counter()
        train()
        calibration.append(time.perf_counter() - begin)
    extra = statistics.median(calibration) * args.slow  # of the step time: 1/9 is 10% slower

    def step() -> None:
        train()
        if extra:
            until = time.perf_counter() + extra
            while time.perf_counter() < until:
                pass

    barrier = (Barrier(Path(args.barrier), 2, 120.0, str(os.getpid())) if args.barrier
               else None)
    timed = measure(Protocol(0, args.steps, args.windows), step, lambda: None,
                    before_window=None if barrier is None else
                    (lambda index: barrier.wait(f"window-{index}")))
    return {"samples_per_s": [BATCH * w.steps / w.elapsed_s for w in timed.windows]}


def command(args: argparse.Namespace, *, threads: int, slow: float = 0.0,
            cpus: list[int] | None = None, barrier: str | None = None) -> list[str]:
    made = [sys.executable, __file__, "--one-launch", "--windows", str(args.windows), "--steps",
            str(args.steps), "--warmup", str(args.warmup), "--threads", str(threads), "--slow",
            str(slow)]
    if cpus:
        made += ["--cpus", ",".join(str(c) for c in cpus)]
    if barrier:
        made += ["--barrier", barrier]
    return made


def run_one(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    begin = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - begin
    return result


def turns_pair(index: int, slow: float, args: argparse.Namespace) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    env = allocator.parse(args.allocator).environment(os.environ)
    made = {side: run_one(command(args, threads=cores, slow=slow if side == "head" else 0.0),
                          env) for side in paired.order(index)}
    return {"base": made["base"]["samples_per_s"], "head": made["head"]["samples_per_s"],
            "wall_s": made["base"]["wall_s"] + made["head"]["wall_s"]}


def duet_pair(index: int, slow: float, args: argparse.Namespace) -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0))
    halves = [cores[: len(cores) // 2], cores[len(cores) // 2:]]
    base_half = index % 2  # swapped from one pair to the next
    with tempfile.TemporaryDirectory(prefix="duet-") as folder:
        begin = time.perf_counter()
        procs = {side: subprocess.Popen(
            command(args, threads=len(halves[0]), slow=slow if side == "head" else 0.0,
                    cpus=halves[base_half if side == "base" else 1 - base_half],
                    barrier=folder), stdout=subprocess.PIPE, text=True,
            env=allocator.parse(args.allocator).environment(os.environ))
            for side in ("base", "head")}
        outs = {side: p.communicate()[0] for side, p in procs.items()}
        wall = time.perf_counter() - begin
    if any(p.returncode for p in procs.values()):
        raise RuntimeError(f"a duet side failed: {outs}")
    got = {side: json.loads(out.strip().splitlines()[-1]) for side, out in outs.items()}
    return {"base": got["base"]["samples_per_s"], "head": got["head"]["samples_per_s"],
            "wall_s": wall, "base_half": base_half}


def collect(args: argparse.Namespace) -> dict[str, Any]:
    pool: dict[str, list[dict[str, Any]]] = {}
    started = time.perf_counter()
    plan = ([("quiet", 0.0)] * args.pairs + [("checked", 1 / 9)] * args.checked
            + [("hog", 0.0)] * args.hog_pairs)
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for number, (condition, slow) in enumerate(plan):
            if condition == "hog" and not hogs:
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        for _ in range(os.cpu_count() or 1)]
            index = sum(1 for c, _ in plan[:number] if c == condition)
            pool.setdefault(f"turns {condition}", []).append(turns_pair(index, slow, args))
            pool.setdefault(f"duet {condition}", []).append(duet_pair(index, slow, args))
            if (number + 1) % 5 == 0:
                print(f"  {number + 1}/{len(plan)} pairs of each mode, "
                      f"{time.perf_counter() - started:.0f} s", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return {"args": {k: v for k, v in vars(args).items() if k not in ("pool_in", "pool_out")},
            "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "pool": pool}


def trial(rng: random.Random, pairs: list[dict[str, Any]], level: float, duet: bool,
          args: argparse.Namespace) -> tuple[str, float, int]:
    """One A/B run drawn from ``pairs``: its outcome, wall time and pairs taken."""
    if duet:  # in launch order, the base on half A, then B, then A, ... as the plugin runs them
        halves = [[p for p in pairs if p["base_half"] == h] for h in (0, 1)]
        count = min(paired.PAIR_LIMIT // 2, *(len(h) for h in halves))
        a, b = (rng.sample(h, count) for h in halves)
        drawn = [p for two in zip(a, b) for p in two]
    else:
        drawn = rng.sample(pairs, min(len(pairs), paired.PAIR_LIMIT))
    alpha = ALPHA / paired.looks(args.per_round, args.most)

    def judged(count: int) -> Any:
        used = [(p["base"], [v * (1 - level) for v in p["head"]]) for p in drawn[:count]]
        return paired.paired_compare(used, args.tolerance, alpha=alpha, per_window=duet), used

    taken = args.per_round
    verdict, used = judged(taken)
    while paired.wants_more_pairs(verdict) and taken + args.per_round <= args.most:
        taken += args.per_round
        verdict, used = judged(taken)
    extra = paired.more_pairs(verdict, used, per_window=duet)
    if extra:
        taken = min(len(drawn), taken + extra)
        verdict, used = judged(taken)
    return verdict.outcome, sum(p["wall_s"] for p in drawn[:taken]), taken


def judge(data: dict[str, Any], args: argparse.Namespace) -> None:
    pool = data["pool"]
    rng = random.Random(args.seed)
    print(f"\ncollected {data['at']}: " + ", ".join(f"{k} {len(v)} pairs"
                                                    for k, v in pool.items()))
    for name, pairs in pool.items():
        duet = name.startswith("duet")
        logs = paired.log_ratios([(p["base"], p["head"]) for p in pairs], per_window=duet)
        ratios = sorted(round(2.718281828 ** v, 3) for v in logs)
        print(f"  {name}: head/base per pair median {statistics.median(ratios):.3f} "
              f"(min {ratios[0]:.3f}, max {ratios[-1]:.3f}); wall a pair "
              f"{statistics.median(p['wall_s'] for p in pairs):.1f} s")
    print(f"\ntolerance {args.tolerance:.0%}; {args.trials} trials a cell; rounds of "
          f"{args.per_round} pairs up to {args.most}, then up to {paired.PAIR_LIMIT} for a "
          "one-sided slowdown\n")
    print("| mode | machine | " + " | ".join(f"{lv:.0%}" for lv in LEVELS)
          + " | unchanged: pass | pairs (mean) | wall per case (mean) |")
    print("|---|---|" + "---|" * (len(LEVELS) + 3))
    for mode in ("turns", "duet"):
        for condition in ("quiet", "hog"):
            pairs = pool.get(f"{mode} {condition}")
            if not pairs or len(pairs) < args.per_round:
                continue
            rates, walls, counts, passed = [], [], [], 0.0
            for level in LEVELS:
                results = [trial(rng, pairs, level, mode == "duet", args)
                           for _ in range(args.trials)]
                rates.append(sum(o == REGRESSION for o, _, _ in results) / len(results))
                if level == 0:  # the rest of an unchanged head's runs: inconclusive
                    passed = sum(o == PASS for o, _, _ in results) / len(results)
                walls += [w for _, w, _ in results]
                counts += [n for _, _, n in results]
            print(f"| {mode} | {condition} | " + " | ".join(f"{r:.1%}" for r in rates)
                  + f" | {passed:.1%} | {statistics.fmean(counts):.1f} | "
                  f"{statistics.fmean(walls):.0f} s |")
    for mode in ("turns", "duet"):
        pairs = pool.get(f"{mode} checked")
        if pairs:
            logs = paired.log_ratios([(p["base"], p["head"]) for p in pairs],
                                     per_window=mode == "duet")
            mean = statistics.fmean(logs)
            print(f"\nreal 10% slowdown, {mode}: head/base {2.718281828 ** mean:.3f} over "
                  f"{len(pairs)} pairs (synthetic 10%: 0.900)", end="")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one-launch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--slow", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--cpus", help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=20, help="quiet pairs of each mode")
    parser.add_argument("--hog-pairs", type=int, default=12)
    parser.add_argument("--checked", type=int, default=6, help="pairs with a real 10%% slowdown")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--allocator", default=allocator.DEFAULT,
                        help="the launches' heap, as --dlperf-allocator takes it")
    parser.add_argument("--per-round", type=int, default=3, help="pairs a look adds")
    parser.add_argument("--most", type=int, default=6, help="pairs before the one-sided limit")
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--pool-out", type=Path)
    parser.add_argument("--pool-in", type=Path)
    args = parser.parse_args(argv)
    if args.one_launch:
        print(json.dumps(one_launch(args)))
        return 0
    data = json.loads(args.pool_in.read_text()) if args.pool_in else collect(args)
    if args.pool_out:
        args.pool_out.write_text(json.dumps(data) + "\n")
    judge(data, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
