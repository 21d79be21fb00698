"""Power of the nightly gate (``dlperf nightly``) on this machine: series of nights, each judged
by A/B against the last good commit, by a one-run baseline recorded on night 1, and by the
history's change points, as ``pytest_dlperf.nightly`` judges them; how many nights a 10% step
and a 1%-a-night creep take to be caught, and how often an unchanged night fails.

Usage::

    .venv/bin/python benchmarks/nightly_power.py --ab-pool ab.json --runs-pool runs.json
        [--series 200] [--nights 20] [--start 6] [--mode duet]

The pools are what the two other power benchmarks collect on this machine (their
``--pool-out``): ``benchmarks/ab_power.py`` (A/B pairs, turns and duet, quiet and beside a CPU
hog on every core; an MLP of width 256) and ``benchmarks/baseline_runs.py`` (runs of three MLP
cases, each run a pytest session's launches minutes apart, quiet and beside a hog). Without
them this script runs both collections first (about an hour).

Method (resampling, ``--series`` series a cell). A series is ``--nights`` nights of one case.
Night 0 records the case's baseline from a recordable quiet run (the nightly records once:
``--dlperf-update-baselines missing``) and is the first last good commit. Night t's code is
slower than night 0's by ``slowdown(t)``: 0 (unchanged), 10% from night ``--start`` on (a step),
or 1% more each night from ``--start`` (a creep: 1 - 0.99^(t - start + 1)). Each night:

- **A/B**, against the last good commit and, where that is not night 0's, against night 0's
  (the anchor: the commit the baseline was recorded at; ``--no-anchor`` leaves it out): pairs
  drawn from the A/B pool of the condition (``--mode``: duet, the nightly's choice
  for a case that fits in half the machine; turns for one that does not), the head's figures
  scaled by tonight's speed over the last good commit's, judged as the plugin does
  (``ab_power.trial``: rounds of 3 pairs up to 6, then 12 for a one-sided slowdown);
- **baselines**: a run drawn from the runs pool of the condition (quiet runs: every quiet run,
  with replacement; beside the hog: the hog runs, whose launches the plugin calls machine busy),
  scaled by ``1 - slowdown(t)``, judged against the runner's baselines (``baseline_runs.judge``,
  the plugin's verdict: a one-run baseline judged by the default drift bound): night 0's run,
  then each night that passed and was judged (not busy) with a pass or an inconclusive verdict
  adds its run, scaled by its own night's slowdown, the newest ``--keep-runs`` kept
  (``store.nights.add_night``, as ``dlperf nightly`` calls it; ``--keep-runs 1``: night 0's
  run alone, as before the rolling window);
- **history**: the night's median (a busy night is not judged, so not in the history) appended
  to the series since night 0, whose change points fail the night when the newest is a step for
  the worse of at least 1% (``verdict.changepoints``: nothing re-records the baseline here, so
  no step is accepted).

A night fails when any judge proves a slowdown; it passes only on a judgement (A/B or the
baselines passed it, as ``nightly.judges`` has it: else it is not judged), and a night that passes
moves the last good commit to its code and adds its run to the baseline (the rolling window of
``--keep-runs`` nights). A night that fails with nothing changed (a false alarm) is what a person looks at and
accepts (``dlperf nightly accept``): the last good commit and the anchor move to its code, and the
next night records the baseline anew (a quiet, recordable run; else the night after), which
accepts the history's steps before it, as ``dlperf nightly`` does after an accept. So each false
alarm costs one night and one look, not every night after it. Reported: the share of unchanged
nights that fail (false alarms) and that no judge could judge, a step's nights until
caught (caught the night it lands, within 10), a creep's (within 10 nights of its start), which
judge caught it first, and a night's wall time (the A/B pairs taken and the baseline run's
launches, at their measured wall times).

A benchmark, not a test: it prints what it measures and exits 0.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import ab_power  # noqa: E402
import baseline_runs  # noqa: E402

from pytest_dlperf.store.nights import ADDED, KEEP_NIGHTS  # noqa: E402
from pytest_dlperf.verdict import changepoints  # noqa: E402
from pytest_dlperf.verdict.stats import IMPROVEMENT, PASS, REGRESSION  # noqa: E402

JUDGED = (PASS, IMPROVEMENT)  # what passes a case (nightly.judges)
KINDS = ("unchanged", "step 10%", "creep 1%/night")


def slowdown(kind: str, night: int, start: int) -> float:
    if kind == "unchanged" or night < start:
        return 0.0
    if kind.startswith("step"):
        return 0.10
    return 1 - 0.99 ** (night - start + 1)


def history_fails(medians: list[float], accepted_at: int = 0) -> bool:
    """The history judge: the newest change point a step for the worse of at least 1% that no
    night from it on accepted (``accepted_at``: the newest night that recorded the baseline)."""
    if len(medians) < 2 * changepoints.MIN_SIZE:
        return False
    found = changepoints.detect(medians)
    large = [p for p in found if abs(p.change) >= changepoints.MIN_CHANGE]
    return bool(large) and large[-1].change < 0 and large[-1].index > accepted_at


def run_median(run: dict[str, Any], case: str, level: float) -> float:
    launches = run["cases"][case]
    return float(statistics.median(statistics.median(one["samples_per_s"]) for one in launches)
                 * (1 - level))


def slowed(run: dict[str, Any], case: str, level: float) -> dict[str, Any]:
    """``run`` with ``case``'s figures as code ``level`` slower would have read them."""
    if not level:
        return run
    launches = [{**one, "samples_per_s": [v * (1 - level) for v in one["samples_per_s"]]}
                for one in run["cases"][case]]
    return {**run, "cases": {**run["cases"], case: launches}}


def series(rng: random.Random, kind: str, condition: str, pools: dict[str, Any],
           args: argparse.Namespace) -> list[dict[str, Any]]:
    """One series of nights: per night (from night 1) which judges failed it, and its wall."""
    runs = pools["runs"]
    quiet = [r for r in runs["runs"] if not r["hog"]]
    hogged = [r for r in runs["runs"] if r["hog"]]
    kept = [r for r in quiet if baseline_runs.recordable([r], args.planned, args.unstable_cv)]
    cases = [str(w) for w in runs["widths"]]
    pairs = pools["ab"]["pool"][f"{args.mode} {condition}"]
    case = rng.choice(cases)
    # The baseline's runs, oldest first, each with its code's slowdown: night 0's, then the
    # nights that passed (the rolling window).
    base = [(rng.choice(kept), 0.0)]
    medians = [run_median(base[0][0], case, 0.0)]
    accepted_at = 0  # the newest night that recorded the baseline (the history's acceptance)
    good, good_night = 0.0, 0  # the last good commit's slowdown, and its night
    anchor, anchor_night = 0.0, 0  # the anchor's (night 0, or the last accepted change)
    rerecord = False
    nights = []
    for night in range(1, args.nights):
        level = slowdown(kind, night, args.start)
        ab, ab_wall, _ = ab_power.trial(rng, pairs, 1 - (1 - level) / (1 - good),
                                        args.mode == "duet", args)
        anchored = None
        if args.anchor and good_night != anchor_night:  # A/B against the anchor's code too
            anchored, anchor_wall, _ = ab_power.trial(
                rng, pairs, 1 - (1 - level) / (1 - anchor), args.mode == "duet", args)
            ab_wall += anchor_wall
        run = rng.choice(quiet if condition == "quiet" else hogged)
        failed = []
        if ab == REGRESSION:
            failed.append("A/B")
        if anchored == REGRESSION:
            failed.append("A/B since the anchor")
        quiet_run = not any((one["busy_share"] or 0.0) > args.busy_threshold
                            for one in run["cases"][case][:args.planned])
        if (rerecord and quiet_run
                and baseline_runs.recordable([run], args.planned, args.unstable_cv)):
            # the night after a person's accept records the baselines anew (when the run is
            # one a recording run keeps), and the history takes every step before it as accepted
            base, rerecord = [(run, level)], False
            medians.append(run_median(run, case, level))
            accepted_at = len(medians) - 1
            taken = args.planned
            outcome, busy = "recorded", False  # the night's run is the baseline already
        else:
            outcome, taken, busy = baseline_runs.judge(
                case, [slowed(r, case, at) for r, at in base], run, level, runs, None, args)
            if not busy:
                if outcome == REGRESSION:
                    failed.append("baselines")
                medians.append(run_median(run, case, level))
                if history_fails(medians, accepted_at):
                    failed.append("history")
        wall = ab_wall + sum(one["wall_s"] for one in run["cases"][case][:taken])
        # A night passes only on a judgement (nightly.judges): A/B or the baselines passed it
        passed = not failed and (ab in JUDGED or anchored in JUDGED
                                 or (not busy and outcome in (*JUDGED, "recorded")))
        nights.append({"night": night, "failed": failed, "wall_s": wall, "level": level,
                       "judged": passed or bool(failed)})
        if passed and not busy and outcome in ADDED:  # the nightly adds the night's run
            base = (base + [(run, level)])[-args.keep_runs:]
        if passed:
            good, good_night = level, night
        elif level == 0:
            # A false alarm: a person looks, finds nothing changed and accepts tonight's commit
            # (dlperf nightly accept): the last good commit and the anchor move here, and the
            # next night records the baselines anew.
            good, good_night = anchor, anchor_night = level, night
            rerecord = True
    return nights


def caught(nights: list[dict[str, Any]], start: int) -> tuple[int | None, str]:
    """Nights from the change's first night to the first failing one (0: that night), and the
    judges that failed it."""
    for one in nights:
        if one["night"] >= start and one["failed"]:
            return one["night"] - start, "+".join(one["failed"])
    return None, ""


def report(pools: dict[str, Any], args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    print(f"A/B pool collected {pools['ab']['at']}; runs pool: "
          f"{sum(not r['hog'] for r in pools['runs']['runs'])} quiet runs, "
          f"{sum(r['hog'] for r in pools['runs']['runs'])} beside a hog")
    print(f"{args.series} series a cell of {args.nights} nights, the change from night "
          f"{args.start}; A/B in {args.mode}, tolerance {args.tolerance:.0%}; A/B against the "
          f"anchor: {'yes' if args.anchor else 'no'}; baselines keep the newest "
          f"{args.keep_runs} night(s)\n")
    print("| machine | change | false alarms a night | caught the night it lands | within 10 "
          "nights | nights to catch (median) | caught first by | wall a night |")
    print("|---|---|---|---|---|---|---|---|")
    for condition in ("quiet", "hog"):
        for kind in KINDS:
            made = [series(rng, kind, condition, pools, args) for _ in range(args.series)]
            walls = [n["wall_s"] for s in made for n in s]
            if kind == "unchanged":
                judged = [n for s in made for n in s]
                alarms = sum(bool(n["failed"]) for n in judged) / len(judged)
                unjudged = sum(not n["judged"] for n in judged) / len(judged)
                by = {j: sum(j in n["failed"] for n in judged) / len(judged)
                      for j in ("A/B", "A/B since the anchor", "baselines", "history")}
                print(f"| {condition} | {kind} | {alarms:.2%} (not judged {unjudged:.1%}) | - "
                      "| - | - | " + ", ".join(f"{j} {v:.2%}" for j, v in by.items())
                      + f" | {statistics.fmean(walls):.0f} s |")
                continue
            found = [caught(s, args.start) for s in made]
            delays = [d for d, _ in found if d is not None]
            judges: dict[str, int] = {}
            for d, j in found:
                if d is not None:
                    judges[j] = judges.get(j, 0) + 1
            first = ", ".join(f"{j} {c / len(made):.0%}" for j, c in
                              sorted(judges.items(), key=lambda kv: -kv[1])[:3])
            print(f"| {condition} | {kind} | - | {sum(d == 0 for d in delays) / len(made):.1%} | "
                  f"{sum(d < 10 for d in delays) / len(made):.1%} | "
                  f"{statistics.median(delays) if delays else '-'} | {first or '-'} | "
                  f"{statistics.fmean(walls):.0f} s |")


def collect(script: str, extra: list[str]) -> dict[str, Any]:
    """Run another power benchmark's collection, keeping its pool."""
    with tempfile.TemporaryDirectory() as scratch:
        pool = Path(scratch) / "pool.json"
        subprocess.run([sys.executable, str(HERE / script), "--pool-out", str(pool), *extra],
                       check=True)
        data: dict[str, Any] = json.loads(pool.read_text())
        return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ab-pool", type=Path, help="benchmarks/ab_power.py --pool-out")
    parser.add_argument("--runs-pool", type=Path, help="benchmarks/baseline_runs.py --pool-out")
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--nights", type=int, default=20)
    parser.add_argument("--start", type=int, default=6, help="the change's first night")
    parser.add_argument("--mode", choices=("duet", "turns"), default="duet")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--per-round", type=int, default=3)
    parser.add_argument("--most", type=int, default=6)
    parser.add_argument("--planned", type=int, default=3)
    parser.add_argument("--busy-threshold", type=float, default=0.25)
    parser.add_argument("--unstable-cv", type=float, default=0.10)
    parser.add_argument("--seed", type=int, default=53)
    parser.add_argument("--no-anchor", dest="anchor", action="store_false",
                        help="judge without A/B against the anchor (night 0's commit)")
    parser.add_argument("--keep-runs", type=int, default=KEEP_NIGHTS,
                        help="the newest nights' runs the baselines keep (1: night 0's alone)")
    args = parser.parse_args()
    pools = {
        "ab": (json.loads(args.ab_pool.read_text()) if args.ab_pool
               else collect("ab_power.py", ["--trials", "1"])),
        "runs": (json.loads(args.runs_pool.read_text()) if args.runs_pool
                 else collect("baseline_runs.py", ["--trials", "1"])),
    }
    report(pools, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
