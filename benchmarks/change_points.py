"""How well the history's change-point gate finds a step, and how often it finds one that is not
there: a simulation on synthetic nightly histories with this machine's measured noise.

Usage::

    .venv/bin/python benchmarks/change_points.py [--pool pool.json] [--cv 0.01,0.02,0.03]
        [--levels 2,3,5,10] [--launches 3] [--before 30] [--trials 1000]
        [--quiet-nights 100] [--quiet-trials 100] [--max-pvalue 0.001] [--min-size 2]
        [--otava]

Method.

- *A night* is one run of a case, and its figure is what the gate judges: the median of its
  ``--launches`` launch medians (the plugin's default run is 3 launches). A launch median is
  drawn from a noise source:

  - ``--pool``: real launches, collected on this machine by ``benchmarks/detection_power.py
    --levels 0 --pool-out pool.json`` (separate processes one after another, each training the
    plugin's torch ResNet-50 trainer and timing its windows through the plugin's meter). A launch
    median is one of those launches' medians, divided by the median of them all, drawn at random
    with replacement: the real spread, tail and all.
  - ``--cv``: a launch median is 1 + a normal draw with that coefficient of variation: what a
    quieter machine (a dedicated GPU runner) would give.

- *Detection*: ``--before`` quiet nights, then a slowdown of each ``--levels`` percent from one
  night on. After each night from the step on, the gate runs as the plugin runs it (the plugin's
  own ``changepoints.steps`` and ``blocking`` over the series so far). A step counts as found
  within k nights when the gate blocked on one of the first k nights from it on, naming a step
  at most 2 nights away from the true one. ``--trials`` histories per level and source.
- *False steps*: ``--quiet-trials`` histories of 10 quiet nights and then ``--quiet-nights`` more
  quiet nights, the gate run after each. A false step is a night on which the gate starts to
  block (it did not the night before); nights blocked counts every night it blocks, since an
  unaccepted step keeps blocking until the data dissolve it or someone records the baseline.
- ``--otava``: the same detection trials through Apache Otava's ``compute_change_points`` (if
  ``otava`` is importable), for comparison with the plugin's own detector. Not a dependency:
  install it in a separate environment to run this.

A benchmark, not a test: it prints figures and exits 0 whatever they are. Goal (issue 17): a 3%
step found within 3 nights at least 95% of the time, at most 1 false step per 100 nights.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_dlperf.store.history import Point  # noqa: E402
from pytest_dlperf.verdict.changepoints import MIN_CHANGE, blocking, steps  # noqa: E402

WITHIN = (1, 3, 7)
NEAR = 2  # nights between the true step and the one named, to count as found
DAY = dt.timedelta(days=1)
START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

Draw = Callable[[random.Random], float]


def pool_source(path: Path) -> tuple[str, Draw, float]:
    data = json.loads(path.read_text())
    medians = [statistics.median(launch["samples_per_s"]) for launch in data["launches"]
               if float(launch.get("level", 0)) == 0]
    centre = statistics.median(medians)
    relative = [m / centre for m in medians]
    cv = statistics.stdev(relative) / statistics.mean(relative)
    return (f"this VM: {len(relative)} real launches", lambda rng: rng.choice(relative), cv)


def gauss_source(cv: float) -> tuple[str, Draw, float]:
    return f"normal, launch CV {cv:.0%}", lambda rng: 1 + rng.gauss(0, cv), cv


def plugin_gate(max_pvalue: float, min_size: int) -> Callable[[list[float]], int | None]:
    """The plugin's gate over a series of nights: the index of the step that blocks the
    newest night, if any."""

    def gate(series: list[float]) -> int | None:
        points = [Point(i + 1, START + i * DAY, f"{i:040x}", "main", "sim", "pass", [[value]])
                  for i, value in enumerate(series)]
        step = blocking(steps(points, "samples_per_s", "samples/s", True, max_pvalue,
                              min_size), MIN_CHANGE)
        return None if step is None else step.point.index

    return gate


def otava_gate(series: list[float]) -> int | None:
    """Apache Otava's detector, with the plugin's rule on top: the newest change point, if it
    is a drop, blocks."""
    from otava.analysis import compute_change_points

    points, _ = compute_change_points(list(series))
    if not points:
        return None
    newest = points[-1]
    return newest.index if newest.stats.mean_2 < newest.stats.mean_1 else None


def night(rng: random.Random, draw: Draw, launches: int, level: float) -> float:
    return 100.0 * (1 - level) * statistics.median(draw(rng) for _ in range(launches))


Gate = Callable[[list[float]], "int | None"]


def detection(rng: random.Random, draw: Draw, args: argparse.Namespace, level: float,
              gate: Gate) -> dict[int, float]:
    found = dict.fromkeys(WITHIN, 0)
    for _ in range(args.trials):
        series = [night(rng, draw, args.launches, 0) for _ in range(args.before)]
        first = None
        for k in range(1, max(WITHIN) + 1):
            series.append(night(rng, draw, args.launches, level))
            at = gate(series)
            if at is not None and abs(at - args.before) <= NEAR:
                first = k
                break
        for k in WITHIN:
            found[k] += first is not None and first <= k
    return {k: n / args.trials for k, n in found.items()}


def quiet(rng: random.Random, draw: Draw, args: argparse.Namespace,
          gate: Gate) -> tuple[float, float]:
    starts = blocked = 0
    for _ in range(args.quiet_trials):
        series = [night(rng, draw, args.launches, 0) for _ in range(10)]
        was = False
        for _ in range(args.quiet_nights):
            series.append(night(rng, draw, args.launches, 0))
            now = gate(series) is not None
            starts += now and not was
            blocked += now
            was = now
    per = 100 / (args.quiet_trials * args.quiet_nights)
    return starts * per, blocked * per


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=Path, help="launches from detection_power.py --pool-out")
    parser.add_argument("--cv", default="0.01,0.02,0.03",
                        help="launch-to-launch CVs of normal noise (comma-separated; '' none)")
    parser.add_argument("--levels", default="2,3,5,10", help="steps, percent")
    parser.add_argument("--launches", type=int, default=3, help="launches per night")
    parser.add_argument("--before", type=int, default=30, help="quiet nights before the step")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--quiet-nights", type=int, default=100)
    parser.add_argument("--quiet-trials", type=int, default=100)
    parser.add_argument("--max-pvalue", type=float, default=0.001)
    parser.add_argument("--min-size", type=int, default=2)
    parser.add_argument("--otava", action="store_true", help="also run Apache Otava's detector")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    levels = [float(x) / 100 for x in args.levels.split(",") if x]
    sources = [pool_source(args.pool)] if args.pool else []
    sources += [gauss_source(float(x)) for x in args.cv.split(",") if x]
    if not sources:
        parser.error("no noise: give --pool or --cv")
    print(f"{args.launches} launches a night, {args.before} quiet nights before the step, "
          f"{args.trials} histories per cell; p <= {args.max_pvalue}, at least "
          f"{args.min_size} nights a side\n")
    header = ["noise", "night CV", *(f"{lv:.0%} within {k}" for lv in levels for k in WITHIN),
              "false steps /100 nights", "nights blocked /100"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    detectors = {"plugin": plugin_gate(args.max_pvalue, args.min_size)}
    if args.otava:
        detectors["otava"] = otava_gate
    for detector, gate in detectors.items():
        for name, draw, launch_cv in sources:
            started = time.perf_counter()
            rng = random.Random(args.seed)
            nights = [night(rng, draw, args.launches, 0) for _ in range(4000)]
            night_cv = statistics.stdev(nights) / statistics.mean(nights)
            cells = []
            for level in levels:
                rates = detection(random.Random(args.seed), draw, args, level, gate)
                cells += [f"{rates[k]:.0%}" for k in WITHIN]
            starts, blocked = quiet(random.Random(args.seed + 1), draw, args, gate)
            cells += [f"{starts:.2f}", f"{blocked:.2f}"]
            label = f"{name} (launch CV {launch_cv:.1%})" + (" [otava]" if detector == "otava"
                                                              else "")
            print("| " + " | ".join([label, f"{night_cv:.1%}", *cells]) + " |", flush=True)
            print(f"  ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
