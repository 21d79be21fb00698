"""Power of the nightly baseline mode on this machine: how often a slowdown is caught, and how
often an unchanged case is flagged, when the baseline was recorded by 1, 3 or 10 runs and the
judged run is a separate run later, quiet and beside a CPU hog; and whether a calibration
canary tracks the machine's drift between runs.

Usage::

    .venv/bin/python benchmarks/baseline_runs.py [--runs 14] [--hog-runs 4] [--trials 400]
        [--pool-out pool.json | --pool-in pool.json | --simulate RUN_SD,LAUNCH_SD]

Method. 1. *Collect* (real launches): ``--runs`` quiet **runs**, each as a pytest session would
take it: for every one of ``--cases`` cases (an MLP of its own width, batch 128), ``--launches``
launches, each a fresh Python process (on the heap ``--allocator`` names, as the plugin's ranks
start on ``--dlperf-allocator``'s) that imports torch, warms up, times ``--windows`` windows
of ``--steps`` steps with the plugin's own window timer (``rank.timing.measure``), then times two
**canaries**: a fixed torch matmul loop (the same framework build) and a framework-free Python
loop. Runs are ``--pause`` seconds apart, so each sees the machine as a later session would.
Then ``--hog-runs`` runs beside a CPU hog this script starts (a ``while True`` process per
core, through ``setsid -f``: another job's, outside this process's tree, as the plugin sees
one). Every launch's interference (``core.interference``: others' share of the CPU while it
ran) is recorded, as the plugin records it.

2. *Judge* (resampling, ``--trials`` per cell): a trial picks a case, ``B`` baseline runs and one
judged run among the quiet runs (never one of its own baseline's; baseline runs only among
those the plugin would have recorded, ``verdict.unstable``), builds the machine's store
from the B runs of **every** case (their first ``--planned`` launches: what recording runs
keep), and judges the case's launches in the judged run, every figure multiplied by
``1 - slowdown``, with the plugin's verdict (``decide.verdicts`` with the drift pooled over the
store, ``verdict.drift``), after every launch as the meter does (``decide.next_launches``, the
extra launches being the judged run's next ones). The slowdown is applied to measured launches
(synthetic, so one collection serves every level: the noise is the machine's, the change
exact). The share of ``regression`` verdicts is the power (at 0%: the false alarms). With
``canary``, every window figure is first divided by its launch's canary rate (how a calibration
workload would normalize it). Beside the hog: the judged run comes from the hog runs, and a
launch whose interference share exceeds ``--busy-threshold`` is what the plugin retries and then
calls *machine busy*: the table shows how many trials that catches, and the verdicts of the
rest. Wall time: the launches a judged case took, at this collection's mean launch wall time.
``--simulate 0.01,0.005`` judges a model machine of those spreads instead (what a GPU node
whose runs drift 1% would give: the same verdict, the same resampling).

A benchmark, not a test: it prints what it measures and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_dlperf.core import allocator, interference  # noqa: E402
from pytest_dlperf.store.baselines import THROUGHPUT, Baseline, Metric, Run  # noqa: E402
from pytest_dlperf.verdict import drift  # noqa: E402
from pytest_dlperf.verdict.decide import Policy, next_launches, verdicts  # noqa: E402
from pytest_dlperf.verdict.stats import REGRESSION, within_launch_cv  # noqa: E402

LEVELS = (0.0, 0.05, 0.10, 0.20, 0.30)
BATCH = 128


def one_launch(args: argparse.Namespace) -> dict[str, Any]:
    """One launch of one case: what a 1n1d rank does, then the two canaries."""
    import torch
    from ab_power import mlp_step  # the same MLP the A/B benchmark trains

    from pytest_dlperf.core.protocol import Protocol
    from pytest_dlperf.rank.timing import measure

    width = args.width
    step = mlp_step(width, args.threads)

    timed = measure(Protocol(args.warmup, args.steps, args.windows), step, lambda: None)
    a = torch.randn(256, 256)
    begin = time.perf_counter()
    for _ in range(200):
        a = torch.tanh(a @ a)
    torch_canary = 200 / (time.perf_counter() - begin)
    begin = time.perf_counter()
    total = 0
    for i in range(400_000):
        total += i * i % 7
    python_canary = 400_000 / (time.perf_counter() - begin)
    return {"width": width, "samples_per_s": [BATCH * w.steps / w.elapsed_s
                                              for w in timed.windows],
            "torch_canary": torch_canary, "python_canary": python_canary}


def launch(width: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--one-launch", "--width", str(width), "--windows",
               str(args.windows), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--threads", str(args.threads)]
    watch = interference.Watch()
    begin = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, check=True,
                         env=allocator.parse(args.allocator).environment(os.environ))
    seen = watch.stop()
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(wall_s=time.perf_counter() - begin, busy_share=seen.share)
    return result


def collect(args: argparse.Namespace) -> dict[str, Any]:
    widths = [192 + 64 * i for i in range(args.cases)]
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    for number in range(args.runs + args.hog_runs):
        hogged = number >= args.runs
        marker = f"dlperf-hog-{os.getpid()}"
        if hogged:  # another job's: started through setsid -f, so not in this process's tree
            for _ in range(os.cpu_count() or 1):
                subprocess.run(["setsid", "-f", sys.executable, "-c", "while True: pass",
                                marker], check=True)
        try:
            cases: dict[str, list[dict[str, Any]]] = {str(w): [] for w in widths}
            for _ in range(args.launches):
                for width in widths:  # cases take turns, as launches of a session's cases do
                    cases[str(width)].append(launch(width, args))
        finally:
            if hogged:
                subprocess.run(["pkill", "-f", marker], check=False)
        runs.append({"hog": hogged, "at": time.time(), "cases": cases})
        print(f"  run {number + 1}/{args.runs + args.hog_runs}{' (hog)' if hogged else ''}, "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        if number + 1 < args.runs + args.hog_runs:
            time.sleep(args.pause)
    return {"args": {k: v for k, v in vars(args).items() if k not in ("pool_in", "pool_out")},
            "widths": widths, "runs": runs}


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    """A machine of the model's making instead of collected launches (``--simulate``): every
    run drifts by ``run_sd`` and every launch by ``launch_sd`` (log scale), windows by a fifth
    of that; for what a machine of another spread (a GPU node's) would give."""
    run_sd, launch_sd = args.simulate
    rng = random.Random(args.seed)
    widths = [192 + 64 * i for i in range(args.cases)]
    runs = []
    for _ in range(args.runs):
        cases = {}
        for number, width in enumerate(widths):
            level = 1000.0 * (number + 1) * math.exp(rng.gauss(0, run_sd))
            launches = []
            for _ in range(args.launches):
                at = level * math.exp(rng.gauss(0, launch_sd))
                launches.append({"samples_per_s": [at * math.exp(rng.gauss(0, launch_sd / 5))
                                                   for _ in range(args.windows)],
                                 "torch_canary": 1.0, "python_canary": 1.0,
                                 "wall_s": args.launch_wall, "busy_share": 0.0})
            cases[str(width)] = launches
        runs.append({"hog": False, "at": 0.0, "cases": cases})
    return {"args": {"windows": args.windows}, "widths": widths, "runs": runs}


def figures(one: dict[str, Any], canary: str | None) -> list[float]:
    """A launch's window figures, divided by its canary's rate where one is asked for."""
    values = list(one["samples_per_s"])
    return values if canary is None else [v / one[canary] for v in values]


def store_drift(runs: list[dict[str, Any]], cases: list[str], planned: int,
                canary: str | None) -> drift.Drift | None:
    return drift.pooled(
        ([figures(one, canary) for run in runs for one in run["cases"][case][:planned]],
         [planned] * len(runs)) for case in cases)


def recordable(runs: list[dict[str, Any]], planned: int, unstable_cv: float) -> bool:
    """Whether every case of these runs would have been recorded: the plugin refuses a run
    whose launches' own windows vary beyond --dlperf-unstable-cv (``verdict.unstable``)."""
    return all(
        (within_launch_cv([one["samples_per_s"] for one in launches[:planned]]) or 0.0)
        <= unstable_cv for run in runs for launches in run["cases"].values())


def judge(case: str, base_runs: list[dict[str, Any]], judged: dict[str, Any], level: float,
          pool: dict[str, Any], canary: str | None, args: argparse.Namespace
          ) -> tuple[str, int, bool]:
    """One trial: the verdict, the launches taken, and whether a launch ran busy."""
    cases = [str(w) for w in pool["widths"]]
    planned, windows = args.planned, pool["args"]["windows"]
    model = store_drift(base_runs, cases, planned, canary)
    launches = [one for run in base_runs for one in run["cases"][case][:planned]]
    baseline = Baseline(case, {}, {THROUGHPUT: Metric(
        [figures(one, canary) for one in launches],
        statistics.median(statistics.median(figures(one, canary)) for one in launches))},
        runs=[Run(None, None, None, planned) for _ in base_runs])
    policy = Policy(tolerance=args.tolerance, repeats=planned * windows,
                    max_repeats=len(judged["cases"][case]) * windows, launches=planned)
    available = judged["cases"][case]
    samples: list[float] = []
    sizes: list[int] = []
    busy = False
    outcome = "pass"
    while True:
        one = available[len(sizes)]
        busy = busy or (one["busy_share"] or 0.0) > args.busy_threshold
        samples += [v * (1 - level) for v in figures(one, canary)]
        sizes.append(windows)
        verdict, _ = verdicts(samples, sizes, baseline, None, 1, policy.tolerance, policy,
                              {THROUGHPUT: model} if model is not None else None)
        outcome = verdict.outcome
        if not next_launches([verdict], len(sizes), policy) or len(sizes) >= len(available):
            return outcome, len(sizes), busy


def resample(pool: dict[str, Any], args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    quiet = [run for run in pool["runs"] if not run["hog"]]
    hogged = [run for run in pool["runs"] if run["hog"]]
    cases = [str(w) for w in pool["widths"]]
    if not quiet:
        print("no quiet runs to judge against (collected beside a hog only: merge the pools)")
        return
    wall = statistics.fmean(one["wall_s"] for run in quiet for c in cases
                            for one in run["cases"][c])
    print(f"\n{len(quiet)} quiet runs, {len(hogged)} beside a hog, {len(cases)} cases x "
          f"{len(quiet[0]['cases'][cases[0]])} launches; mean launch {wall:.1f} s; tolerance "
          f"{args.tolerance:.0%}; {args.trials} trials a cell")
    canaries = (None, "torch_canary") if not args.simulate else (None,)
    refused = sum(not recordable([run], args.planned, args.unstable_cv) for run in quiet)
    print(f"  {refused} of {len(quiet)} quiet runs would not have been recorded (a case's "
          f"launches' windows beyond --dlperf-unstable-cv {args.unstable_cv:.0%}): baselines "
          "are drawn from the others")
    for canary in (None, "torch_canary", "python_canary"):
        model = store_drift(quiet, cases, args.planned, canary)
        if model is not None:
            print(f"  drift model over every quiet run, {canary or 'raw'}: run sd "
                  f"{math.sqrt(model.run_variance):.1%}, launch sd {math.sqrt(model.within):.1%}"
                  f" ({model.between_df} df)")
    header = "| baseline | judged | normalized | " + " | ".join(
        f"{level:.0%}" for level in LEVELS) + " | launches | wall per case |"
    print("\n" + header + "\n|" + "---|" * (header.count("|") - 1))
    # A baseline is drawn from the runs the plugin would have recorded (=add refuses the
    # others), the judged run from the other quiet runs: rejection sampling of whole draws never
    # ends where fewer runs are recordable than a baseline takes.
    kept = [run for run in quiet if recordable([run], args.planned, args.unstable_cv)]
    for runs in args.baseline_runs:
        if runs > len(kept) or runs + 1 > len(quiet):
            print(f"| {runs} runs | - | - | (needs {runs} recordable quiet runs and one more: "
                  f"{len(kept)} of {len(quiet)} were recordable) |")
            continue
        for canary in canaries:
            rates, used = [], []
            for level in LEVELS:
                caught = 0
                for _ in range(args.trials):
                    base = rng.sample(kept, runs)
                    judged = rng.choice([run for run in quiet if run not in base])
                    outcome, taken, _ = judge(rng.choice(cases), base, judged, level, pool,
                                              canary, args)
                    caught += outcome == REGRESSION
                    used.append(taken)
                rates.append(caught / args.trials)
            print(f"| {runs} run{'s' if runs > 1 else ''} | quiet | {canary or 'no'} | "
                  + " | ".join(f"{r:.1%}" for r in rates)
                  + f" | {statistics.fmean(used):.1f} | {statistics.fmean(used) * wall:.0f} s |")
    if not hogged:
        return
    runs = min(3, len(kept))
    if not runs:
        print("no recordable quiet run to judge the hog runs against")
        return
    rates, busy_rates, used = [], [], []
    for level in LEVELS:
        caught = busy = 0
        for _ in range(args.trials):
            base = rng.sample(kept, runs)
            outcome, taken, was_busy = judge(rng.choice(cases), base,
                                             rng.choice(hogged), level, pool, None, args)
            busy += was_busy
            caught += outcome == REGRESSION and not was_busy
            used.append(taken)
        rates.append(caught / args.trials)
        busy_rates.append(busy / args.trials)
    print(f"| {runs} runs | beside a hog: regression (not busy) | no | "
          + " | ".join(f"{r:.1%}" for r in rates)
          + f" | {statistics.fmean(used):.1f} | - |")
    print(f"| {runs} runs | beside a hog: machine busy | no | "
          + " | ".join(f"{r:.1%}" for r in busy_rates) + " | | |")
    shares = [one["busy_share"] or 0.0 for run in hogged for c in cases
              for one in run["cases"][c]]
    quiet_shares = [one["busy_share"] or 0.0 for run in quiet for c in cases
                    for one in run["cases"][c]]
    print(f"\ninterference share: quiet launches median {statistics.median(quiet_shares):.1%} "
          f"(max {max(quiet_shares):.1%}); beside the hog median "
          f"{statistics.median(shares):.1%} (min {min(shares):.1%})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one-launch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=14)
    parser.add_argument("--hog-runs", type=int, default=4)
    parser.add_argument("--cases", type=int, default=3)
    parser.add_argument("--launches", type=int, default=4, help="per case and run")
    parser.add_argument("--planned", type=int, default=3, help="launches a run plans")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--allocator", default=allocator.DEFAULT,
                        help="the launches' heap, as --dlperf-allocator takes it")
    parser.add_argument("--pause", type=float, default=10.0, help="seconds between runs")
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--busy-threshold", type=float, default=0.25)
    parser.add_argument("--unstable-cv", type=float, default=0.10)
    parser.add_argument("--baseline-runs", type=lambda s: [int(v) for v in s.split(",")],
                        default=[1, 3, 10])
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--simulate", type=lambda s: [float(v) for v in s.split(",")],
                        metavar="RUN_SD,LAUNCH_SD",
                        help="judge a model machine of these spreads instead of launches")
    parser.add_argument("--launch-wall", type=float, default=10.0,
                        help="seconds a simulated launch takes")
    parser.add_argument("--pool-out", type=Path)
    parser.add_argument("--pool-in", type=Path)
    args = parser.parse_args()
    if args.one_launch:
        print(json.dumps(one_launch(args)))
        return 0
    if args.simulate:
        print(f"simulated machine: runs drift {args.simulate[0]:.1%}, launches "
              f"{args.simulate[1]:.1%} (log sd), {args.launch_wall:g} s a launch")
        pool = simulate(args)
    elif args.pool_in:
        pool = json.loads(args.pool_in.read_text())
    else:
        print(f"collecting {args.runs} quiet runs and {args.hog_runs} beside a hog "
              f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", flush=True)
        pool = collect(args)
        if args.pool_out:
            args.pool_out.write_text(json.dumps(pool))
    resample(pool, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
