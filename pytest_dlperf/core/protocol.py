"""The DLPerf measurement protocol: warm-up, timed steps, repeats, and the throughput arithmetic.

Imported by the worker side too: standard library only.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .interference import Interference
from .phases import PhaseSamples


@dataclass(frozen=True)
class Protocol:
    """How one case is measured: ``warmup_steps`` untimed, then ``repeats`` windows of ``steps``."""

    warmup_steps: int
    steps: int
    repeats: int
    name: str = "custom"

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps * self.repeats

    @property
    def slug(self) -> str:
        """Names what a window measures in baseline keys: two protocols whose windows differ
        never share a baseline. The repeat count is a sample size, not part of it."""
        return f"w{self.warmup_steps}-s{self.steps}"

    def to_json(self) -> dict[str, object]:
        return asdict(self)


# DLPerf: skip 20 warm-up steps, time the next 100, repeat 7 times, report the median.
FULL = Protocol(warmup_steps=20, steps=100, repeats=7, name="full")
# CI on a 2-core CPU box: enough warm-up for allocator and gloo buffers to settle (the step time
# is flat after ~3 steps at 32x32), windows long enough (~2-4 s) that timer and scheduling
# jitter stay well under a percent, and 5 windows so the median means something.
QUICK = Protocol(warmup_steps=5, steps=10, repeats=5, name="quick")
PROFILES: dict[str, Protocol] = {p.name: p for p in (FULL, QUICK)}
# Launches per case unless --dlperf-launches says otherwise (docs/measurements/harness.md,
# "Repeats and launches").
DEFAULT_LAUNCHES = 3


def resolve(profile: str, warmup_steps: int | None = None, steps: int | None = None,
            repeats: int | None = None) -> Protocol:
    """A named profile with any explicitly given counts overriding it."""
    base = PROFILES[profile]
    if warmup_steps is None and steps is None and repeats is None:
        return base
    return Protocol(
        warmup_steps=base.warmup_steps if warmup_steps is None else warmup_steps,
        steps=base.steps if steps is None else steps,
        repeats=base.repeats if repeats is None else repeats,
        name=f"{base.name}+custom",
    )


def throughput(global_batch: int, steps: int, elapsed_s: float) -> float:
    """Samples per second of one window: every rank processed its per-device batch each step."""
    if elapsed_s <= 0:
        raise ValueError(f"elapsed time must be > 0, got {elapsed_s}")
    return global_batch * steps / elapsed_s


def window_elapsed(per_rank_elapsed: list[float]) -> float:
    """A window lasts until its slowest rank is done: the step is global under data parallelism."""
    if not per_rank_elapsed:
        raise ValueError("no rank reported this window")
    return max(per_rank_elapsed)


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def median_of_launches(launches: Sequence[Sequence[float]]) -> float:
    """DLPerf's figure for a case measured over several launches: the median of each launch's
    median window figure (a launch being a repeat). The one place this is computed: the
    verdict, the baselines, the history and the results all take it from here."""
    return median([median(list(launch)) for launch in launches])


def split(values: list[float], sizes: list[int]) -> list[list[float]]:
    """``values`` cut into consecutive groups of ``sizes`` (empty sizes: one group)."""
    if not sizes:
        return [list(values)]
    groups, start = [], 0
    for size in sizes:
        groups.append(list(values[start:start + size]))
        start += size
    return groups


def launch_size(repeats: int, launches: int) -> int:
    """Windows each launch times so that ``launches`` launches give at least ``repeats``."""
    return -(-repeats // launches)


@dataclass
class RankFigures:
    """One rank's own figures over a case's launches: where it ran, its windows' seconds per
    step, its own compute speed (``local_step_s``: forward and backward without the all-reduce,
    one figure per launch; empty where the adapter has none or the case has one rank) and its
    peak memory per window (bytes; empty where it was not measured)."""

    rank: int
    node_rank: int = 0
    local_rank: int = 0
    host: str = ""
    step_s: list[float] = field(default_factory=list)
    local_step_s: list[float] = field(default_factory=list)
    peak_bytes: list[float] = field(default_factory=list)
    memory_source: str = ""
    # The framework's counters and NVML's figure of this rank's worst window (bytes).
    memory_counters: dict[str, float] = field(default_factory=dict)
    # Each window's minor page faults per step (``rank.memory``); empty: not measured.
    faults_per_step: list[float] = field(default_factory=list)

    @property
    def median_step_s(self) -> float:
        return median(self.step_s)

    @property
    def own_step_s(self) -> float | None:
        """The rank's own (collective-free) seconds per step, median over its launches."""
        return median(self.local_step_s) if self.local_step_s else None

    @property
    def peak(self) -> float | None:
        return max(self.peak_bytes) if self.peak_bytes else None

    def extended(self, more: RankFigures) -> RankFigures:
        worst = self.memory_counters
        if more.peak is not None and (self.peak is None or more.peak > self.peak):
            worst = more.memory_counters
        return RankFigures(self.rank, self.node_rank, self.local_rank, self.host,
                           self.step_s + more.step_s, self.local_step_s + more.local_step_s,
                           self.peak_bytes + more.peak_bytes,
                           self.memory_source or more.memory_source, dict(worst),
                           self.faults_per_step + more.faults_per_step)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "node_rank": self.node_rank, "local_rank": self.local_rank,
                "host": self.host, "median_step_s": self.median_step_s if self.step_s else None,
                "own_step_s": self.own_step_s, "peak_memory_bytes": self.peak,
                "memory_source": self.memory_source, "memory_counters": self.memory_counters}

    @classmethod
    def of(cls, rank_result: dict[str, Any]) -> RankFigures:
        """From one rank's result file (``pytest_dlperf.rank.worker``)."""
        memory = rank_result.get("memory") or {}
        windows = memory.get("windows") or []
        peaks = [w["peak_bytes"] for w in windows if w.get("peak_bytes") is not None]
        worst: dict[str, Any] = max(windows, key=lambda w: w.get("peak_bytes") or 0, default={})
        local = rank_result.get("local_step_s")
        timed = rank_result.get("windows", [])
        faults = [w.get("minor_faults") for w in windows]
        return cls(rank=int(rank_result.get("rank", 0)),
                   node_rank=int(rank_result.get("node_rank", 0)),
                   local_rank=int(rank_result.get("local_rank", 0)),
                   host=str(rank_result.get("host", "")),
                   step_s=[w["elapsed_s"] / w["steps"] for w in timed],
                   local_step_s=[float(local)] if local is not None else [],
                   peak_bytes=[float(p) for p in peaks] if len(peaks) == len(windows) else [],
                   memory_source=str(memory.get("source", "")),
                   memory_counters={k: float(v) for k, v in worst.items()
                                    if isinstance(v, (int, float))
                                    and k not in ("peak_bytes", "minor_faults")},
                   faults_per_step=([f / w["steps"] for f, w in zip(faults, timed)]
                                    if len(faults) == len(timed) and None not in faults
                                    else []))


@dataclass
class Result:
    """One case's figures after the protocol: what the baseline comparison consumes."""

    samples_per_s: list[float]  # one per timed window (repeat), in run order
    window_s: list[float]  # each window's elapsed seconds (slowest rank)
    steps: int  # timed steps per window
    global_batch: int
    warmup_s: float
    wall_s: float  # the whole case, process start-up included
    timed_from: float = 0.0  # epoch seconds when the last rank began its first timed step
    first_step_s: float = 0.0  # the slowest rank's first warm-up step (compilation, tracing)
    # Windows per launch, in run order (each launch a fresh start of the case's processes);
    # empty: one launch holding every window.
    launch_windows: list[int] = field(default_factory=list)
    # Each window's peak memory, the largest over the ranks (bytes); empty: not measured.
    memory_bytes: list[float] = field(default_factory=list)
    ranks: list[RankFigures] = field(default_factory=list)
    # What each launch ran beside (one entry per launch, in run order; empty: not measured).
    interference: list[Interference] = field(default_factory=list)
    # The diagnostic steps' phases, every launch's (None: none ran, or --dlperf-phases off).
    phases: PhaseSamples | None = None
    # Each window's minor page faults per step, the most over the ranks; empty: not measured.
    faults_per_step: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.launch_windows and sum(self.launch_windows) != len(self.samples_per_s):
            raise ValueError(f"launch_windows {self.launch_windows} do not add up to the "
                             f"{len(self.samples_per_s)} windows")

    @property
    def launches(self) -> list[list[float]]:
        """The window figures grouped by launch: the verdict's unit of evidence."""
        return split(self.samples_per_s, self.launch_windows)

    @property
    def launch_medians(self) -> list[float]:
        return [median(launch) for launch in self.launches]

    @property
    def median(self) -> float:
        """DLPerf's figure: the median of the repeats, a repeat being a launch (with one
        launch, the median of its windows)."""
        return median_of_launches(self.launches)

    @property
    def step_s(self) -> float:
        """The latency of one iteration at the median: a step's global batch over the median
        rate (DLPerf's Wide & Deep figure, in seconds)."""
        return self.global_batch / self.median

    @property
    def min(self) -> float:
        return min(self.samples_per_s)

    @property
    def max(self) -> float:
        return max(self.samples_per_s)

    @property
    def timed_steps(self) -> int:
        return self.steps * len(self.window_s)

    def extended(self, more: Result) -> Result:
        """This result plus the windows of another launch of the same case."""
        if (more.steps, more.global_batch) != (self.steps, self.global_batch):
            raise ValueError("extra repeats must use the same steps per window and global batch")
        both = bool(self.memory_bytes) and bool(more.memory_bytes)
        faulted = bool(self.faults_per_step) and bool(more.faults_per_step)
        ranks = ([a.extended(b) for a, b in zip(self.ranks, more.ranks)]
                 if len(self.ranks) == len(more.ranks) else self.ranks)
        return Result(samples_per_s=self.samples_per_s + more.samples_per_s,
                      window_s=self.window_s + more.window_s, steps=self.steps,
                      global_batch=self.global_batch, warmup_s=self.warmup_s,
                      wall_s=self.wall_s + more.wall_s, timed_from=self.timed_from,
                      first_step_s=self.first_step_s,
                      launch_windows=self.windows_per_launch + more.windows_per_launch,
                      memory_bytes=self.memory_bytes + more.memory_bytes if both else [],
                      ranks=ranks, interference=self.interference + more.interference,
                      phases=self.phases.extended(more.phases) if self.phases is not None
                      else more.phases,
                      faults_per_step=(self.faults_per_step + more.faults_per_step if faulted
                                       else []))

    @property
    def memory_launches(self) -> list[list[float]]:
        """Each window's peak memory, grouped by launch (empty: not measured)."""
        return split(self.memory_bytes, self.launch_windows) if self.memory_bytes else []

    @property
    def faults_launches(self) -> list[list[float]]:
        """Each window's page faults per step, grouped by launch (empty: not measured)."""
        return split(self.faults_per_step, self.launch_windows) if self.faults_per_step else []

    @property
    def peak_memory(self) -> float | None:
        """The case's peak memory: the largest window's, over every rank."""
        return max(self.memory_bytes) if self.memory_bytes else None

    @property
    def windows_per_launch(self) -> list[int]:
        return list(self.launch_windows) or [len(self.samples_per_s)]


def aggregate(rank_results: list[dict[str, Any]], per_device_batch: int, wall_s: float,
              data_parallel: int | None = None, units_per_sample: int = 1) -> Result:
    """Combine every rank's windows: window i lasts as long as its slowest rank took. A step
    trains ``per_device_batch`` samples on each of ``data_parallel`` replicas (default: every
    rank; a layout's tensor- and pipeline-parallel ranks share one), of ``units_per_sample``
    units each: the rates count units (a language model's tokens)."""
    if not rank_results:
        raise ValueError("no rank results to aggregate")
    counts = {len(r["windows"]) for r in rank_results}
    if len(counts) != 1:
        raise ValueError(f"ranks reported different numbers of windows: {sorted(counts)}")
    global_batch = per_device_batch * (data_parallel or len(rank_results)) * units_per_sample
    window_s, rates = [], []
    steps = rank_results[0]["windows"][0]["steps"] if counts != {0} else 0
    for i in range(counts.pop()):
        elapsed = window_elapsed([r["windows"][i]["elapsed_s"] for r in rank_results])
        window_s.append(elapsed)
        rates.append(throughput(global_batch, steps, elapsed))
    ranks = [RankFigures.of(r) for r in rank_results]
    windows = len(window_s)
    memory: list[float] = []
    if windows and all(len(r.peak_bytes) == windows for r in ranks):
        memory = [max(r.peak_bytes[i] for r in ranks) for i in range(windows)]
    faults: list[float] = []
    if windows and all(len(r.faults_per_step) == windows for r in ranks):
        faults = [max(r.faults_per_step[i] for r in ranks) for i in range(windows)]
    return Result(samples_per_s=rates, window_s=window_s, steps=steps, global_batch=global_batch,
                  warmup_s=max(r["warmup_s"] for r in rank_results), wall_s=wall_s,
                  timed_from=max(r.get("timed_from", 0.0) for r in rank_results),
                  first_step_s=max(r.get("first_step_s", 0.0) for r in rank_results),
                  memory_bytes=memory, ranks=ranks, phases=PhaseSamples.of(rank_results),
                  faults_per_step=faults)
