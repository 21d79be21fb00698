"""A case whose first launch of a run reads apart from the run's other launches, run after run:
its launches are not repeats of one measurement. The plugin starts every launch the same way
(the FLOP count and the diagnostic steps after the windows, the heap allocator fixed:
``core.allocator``), so what this finds is the workload's own (a cache filled by the first
launch, a compiled kernel or JIT cache written to disk, a file read from a cold page cache)
or the machine's (a CPU that runs faster until it warms up). It is told, as an unstable case
is, not averaged in silently. Pure functions of the figures, as ``decide``'s.

The test. In each run of at least three launches, ``d`` is the log of launch 1's median window
figure less the mean log median of the run's other launches. Under launches that are alike,
``d`` is zero on average, with the spread of the other launches about their mean (pooled over
the runs, ``sum(n - 2)`` degrees of freedom) times ``sqrt(1 + 1/(n - 1))``. The case is named
when the mean ``d`` over the runs is two-sided significant at ``ALPHA`` (Student's t), beyond
the windows' own noise (``NOISE_FACTOR`` standard errors of a launch median from its windows'
spread), and beyond ``TREND_FACTOR`` times the mean step from launch 2 to the run's last: a
machine drifting steadily over a run's launches moves every launch, not the first alone (a
linear trend puts launch 1 1.5 steps from the mean of two more, and ``d`` grows with the runs'
count however alike the launches' starts), and is not what this names. For example, three sessions of a small MLP whose first launch counted FLOPs before its windows
(1.35x, 1.44x and 1.57x the others, which were 1-12% apart) give p = 0.0004 on 3 degrees of
freedom.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .stats import Launches, within_launch_cv

ALPHA = 0.01
# How many standard errors of a launch's median (from its windows' spread) the first launch
# must stand apart by: below that, the windows cannot tell the launches apart anyway.
NOISE_FACTOR = 3.0
# How far beyond the others' own mean step (launch 2 to the last) launch 1 must stand.
TREND_FACTOR = 2.0
MIN_LAUNCHES = 3  # a run's first launch against at least two others
MIN_RUNS = 2  # one run cannot tell a first launch from the machine's drift within it


@dataclass(frozen=True)
class FirstLaunchApart:
    """The first launch's ratio to the others (geometric, over the runs), each run's, and the
    evidence."""

    ratio: float
    runs: tuple[float, ...]
    p: float
    df: int

    def describe(self, unit: str) -> str:
        each = ", ".join(f"{r:.2f}x" for r in self.runs)
        side = "faster" if self.ratio > 1 else "slower"
        return (f"launch 1 of each run read {self.ratio:.2f}x the run's other launches in "
                f"{unit}/s ({side}; {len(self.runs)} runs: {each}; p = {self.p:.2g}, "
                f"t-test on {self.df} degrees of freedom)")


def _log_medians(run: Launches) -> list[float]:
    return [math.log(statistics.median(launch)) for launch in run]


def first_launch_apart(runs: Sequence[Launches]) -> FirstLaunchApart | None:
    """The finding over ``runs`` (each a run's launches, in launch order, each launch its
    window figures); None where the first launches are alike the others, or too few runs of
    enough launches can tell."""
    usable = [run for run in runs if len(run) >= MIN_LAUNCHES
              and all(launch and min(launch) > 0 for launch in run)]
    if len(usable) < MIN_RUNS:
        return None
    gaps, squares, df, weights = [], 0.0, 0, 0.0
    for run in usable:
        logs = _log_medians(run)
        others = logs[1:]
        centre = statistics.fmean(others)
        gaps.append(logs[0] - centre)
        squares += sum((x - centre) ** 2 for x in others)
        df += len(others) - 1
        weights += 1 + 1 / len(others)
    mean_gap = statistics.fmean(gaps)
    spread = math.sqrt(squares / df)
    trend = abs(statistics.fmean(_log_medians(run)[-1] - _log_medians(run)[1] for run in usable))
    if (spread == 0 or abs(mean_gap) <= NOISE_FACTOR * _launch_median_noise(usable)
            or abs(mean_gap) <= TREND_FACTOR * trend):
        return None  # (launches alike to the last digit: figures of a model, not a machine)
    from scipy.stats import t as student

    error = spread * math.sqrt(weights) / len(usable)
    p = float(2 * student.sf(abs(mean_gap) / error, df))
    if p >= ALPHA:
        return None
    return FirstLaunchApart(math.exp(mean_gap), tuple(math.exp(g) for g in gaps), p, df)


def _launch_median_noise(runs: Sequence[Launches]) -> float:
    """The standard error of one launch's median (log scale, ~ relative) from the spread of
    windows within launches; 0 where launches have one window each."""
    launches = [launch for run in runs for launch in run]
    within = within_launch_cv(launches)
    if within is None:
        return 0.0
    windows = statistics.median(len(launch) for launch in launches)
    # The median of n windows has ~1.25x the standard error of their mean (of 2, it is it).
    return (1.25 if windows > 2 else 1.0) * within / math.sqrt(windows)


def baseline_runs(launches: Launches, run_sizes: Sequence[int], keep: int | None = None
                  ) -> list[list[list[float]]]:
    """A baseline's launches cut into the runs that gave them (oldest first). Where the
    baseline holds ``keep`` launches, or its oldest run fewer than every other run, that run
    may have lost its first launches to the limit, and is left out: its first is no longer its
    launch 1."""
    if sum(run_sizes) != len(launches):
        return []
    runs, start = [], 0
    for size in run_sizes:
        runs.append([list(launch) for launch in launches[start:start + size]])
        start += size
    trimmed = ((keep is not None and len(launches) >= keep)
               or (len(run_sizes) > 1 and run_sizes[0] < min(run_sizes[1:])))
    return runs[1:] if trimmed else runs


def warning(case: str, finding: FirstLaunchApart, unit: str) -> str:
    """What the verdict says of a case ``first_launch_apart`` named."""
    return (f"pytest-dlperf: {case}'s launches differ by position: {finding.describe(unit)}. "
            "Every launch starts the same way (the plugin counts FLOPs and runs its diagnostic "
            "steps after the windows; the heap allocator is fixed, --dlperf-allocator), so the "
            "first launch differs for the workload's or the machine's own reasons: a cache the "
            "first launch fills (files, a compiled kernel, a JIT cache on disk), a cold page "
            "cache, a CPU that slows once warm. Its launches are not repeats of one "
            "measurement, and the verdict's spread between launches includes the difference: "
            "warm it in the recipe or the warm-up (--dlperf-warmup-steps), or make each launch "
            "start alike")
