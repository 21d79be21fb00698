"""Launching a case: its measured launches (each a fresh start of the case's processes), the
batch-size probes of ``--dlperf-batch-size max``, and the 1n1d reference a scaling case is
measured against when nothing else has it. Each launch goes through the cluster's launcher and
comes back as the ranks' aggregated figures, with the interference it ran beside
(``core.interference``); where the caller asks (baseline mode), a launch beside heavy
interference is run again, and ``MachineBusy`` is raised when it stays."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..core import interference
from ..core.batchsearch import BATCH, BatchSearchError, Probe, Search, search, search_flag, what
from ..core.interference import Interference
from ..core.protocol import Protocol, Result, aggregate
from ..core.spec import RankSpec
from ..core.topology import Topology
from ..launch import Cluster, LaunchError, Watch
from ..verdict import busy
from .case import Case
from .outcome import fail

# Steps a batch-size probe trains: enough for the optimizer's state and the allocators'
# high-water mark (the first step allocates the most), not a measurement.
PROBE_STEPS = 3


class OutOfMemoryAtTheEdge(Exception):
    """A measurement at a batch the search found ran out of memory."""

    def __init__(self, seconds: float, message: str) -> None:
        super().__init__(message)
        self.seconds, self.message = seconds, message


class MachineBusy(Exception):
    """A launch ran beside heavy interference, and again on each retry: ``seen`` is what the
    last one measured; ``measured``, the case's windows so far (its earlier launches', then the
    last retry's), shown marked though not judged."""

    def __init__(self, label: str, seen: Interference, retries: int,
                 measured: Result | None = None) -> None:
        super().__init__(f"{label}: {busy.describe(seen)}")
        self.label, self.seen, self.retries = label, seen, retries
        self.measured = measured


def _first_line(exc: LaunchError) -> str:
    """The first line of the first rank's error (an out-of-memory one says the batch), and its
    last (the exception) where the first opens a traceback."""
    first = next(iter(exc.rank_errors.values()), exc.summary)
    lines = [line.strip() for line in first.strip().splitlines() if line.strip()] or [""]
    head = lines[0].replace("Traceback (most recent call last):", "").strip()
    if head == lines[0] or len(lines) == 1:
        return head[:300]
    return (f"{head} {lines[-1]}" if head else lines[-1])[:300]


@dataclass
class Launches:
    """The launches of one case. ``rank_flops``: what rank 0 of the last launch that counted
    FLOPs reported (torch ranks count after the first launch's windows where the session has
    no count).
    ``retry_busy``: a launch beside more interference than --dlperf-busy-threshold is run
    again (``busy.RETRIES`` times), then ``MachineBusy`` is raised; off, interference is only
    recorded (A/B, where both sides share it)."""

    case: Case
    rank_flops: dict[str, Any] | None = field(default=None)
    retry_busy: bool = False

    def measure(self, spec: RankSpec, windows: list[int], *, at_the_edge: bool = False,
                done: int = 0, planned: int | None = None,
                missed: Callable[[float, str], None] | None = None
                ) -> tuple[Result, dict[str, Any]]:
        """One launch per entry of ``windows``, each timing that many windows.
        ``at_the_edge``: the batch is one a search found; running out of memory raises
        ``OutOfMemoryAtTheEdge`` (the caller steps down) instead of failing the case.
        ``done``: these launches come after that many; ``planned``: the run's launches (those
        beyond them are extra, for an inconclusive verdict). ``missed(seconds, message)``: a
        launch at the edge that ran out of memory after others fitted, and ran again."""
        result: Result | None = None
        env: dict[str, Any] = {}
        planned = planned or len(windows)
        for index, count in enumerate(windows):
            # The FLOP count and the phases' diagnostic steps in the run's first launch only,
            # after its timed windows: a case's wall time pays for them once (docs/phases.md),
            # and every launch times the same steps after the same start (a count before the
            # windows made launch 1 of a small CPU model 1.3-1.8x faster than the others).
            launched = replace(spec, protocol=replace(spec.protocol, repeats=count),
                               count_flops=spec.count_flops and index == 0,
                               phase_steps=spec.phase_steps if done + index == 0 else 0)
            number = done + index + 1
            label = (f"launch {number}/{planned}" if number <= planned
                     else f"extra launch {number - planned} (inconclusive after {planned})")
            try:
                try:
                    one, env = self.run(self.case.cluster, launched, at_the_edge=at_the_edge,
                                        label=label)
                except OutOfMemoryAtTheEdge as edge:
                    if result is None:  # no launch fitted at this value: the caller steps down
                        raise
                    # Launches fitted here before it: memory at the edge moves launch to launch
                    # (InsightFace's two ranks: 3.60-3.71 GB at one size), so they are kept and
                    # this one runs again, once; out of memory again, the caller steps down.
                    if missed is not None:
                        missed(edge.seconds, edge.message)
                    one, env = self.run(self.case.cluster, launched, at_the_edge=at_the_edge,
                                        label=f"{label}, again (out of memory at the edge)")
            except MachineBusy as stayed:  # the launches before it measured too
                if result is not None and stayed.measured is not None:
                    stayed.measured = result.extended(stayed.measured)
                raise
            result = one if result is None else result.extended(one)
        assert result is not None, "at least one launch"
        return result, env

    def watch(self, label: str, windows: bool = True) -> Watch | None:
        """Live progress of one launch (``live.LiveLine``), labelled with this case; None
        where nothing is shown (-q): the ranks then write no progress at all. ``windows``
        False: a probe's (no window figure shown)."""
        live = self.case.state.live
        if live is None or live.mode is None:
            return None
        name = self.case.node.name
        return lambda path: live.watch(path, name, label, windows)

    def _note(self, label: str, text: str) -> None:
        live = self.case.state.live
        if live is not None:
            live.note(self.case.node.name, label, text)

    def run(self, cluster: Cluster, spec: RankSpec, *, at_the_edge: bool = False,
            label: str = "launch", who: str = "") -> tuple[Result, dict[str, Any]]:
        """One launch; ``who``: which side of an A/B run it is, for a failure's message. Run
        again while it ran beside heavy interference, where ``retry_busy`` says so."""
        threshold = self.case.state.settings.busy_threshold
        retries = 0
        while True:
            # A retry says so: "launch 1/3, retry 2 of 2 (machine busy)".
            shown = (label if not retries else
                     f"{label}, retry {retries} of {busy.RETRIES} (machine busy)")
            result, env, seen = self._once(cluster, spec, at_the_edge, shown, who)
            if not (self.retry_busy and busy.is_busy(seen, threshold)):
                break
            if retries == busy.RETRIES:
                raise MachineBusy(label, seen, retries, result)
            retries += 1
            time.sleep(busy.PAUSE_S)
        return replace(result, interference=[replace(seen, retries=retries)]), env

    def _once(self, cluster: Cluster, spec: RankSpec, at_the_edge: bool, label: str,
              who: str) -> tuple[Result, dict[str, Any], Interference]:
        cuda = cluster.device_type == "cuda"
        gpus = interference.gpu_others() if cuda else ()
        watch = interference.Watch()
        started = time.perf_counter()
        try:
            ranks = cluster.run(spec, self.watch(label))
        except LaunchError as exc:
            if at_the_edge and exc.kind == "out_of_memory":
                raise OutOfMemoryAtTheEdge(time.perf_counter() - started,
                                           _first_line(exc)) from exc
            fail(f"pytest-dlperf: {self.case.id}{who} {exc.kind.replace('_', ' ')} on "
                 f"{cluster.topology.id}: {exc}")
        finally:
            wall = time.perf_counter() - started
            seen = watch.stop()
        seen = replace(seen, gpu_processes=interference.merge(
            gpus, interference.gpu_others() if cuda else ()))
        env = dict(ranks[0]["environment"])
        if spec.count_flops:
            self.rank_flops = ranks[0].get("flops")
        hardware = self.case.state.hardware
        if cuda:  # what NVML says, beside what the framework saw
            env.update(driver=hardware.gpu_driver, gpu_memory_bytes=list(hardware.gpu_memory))
        layout = spec.parallel(len(ranks))
        return (aggregate(ranks, spec.batch_size, wall, layout.data_parallel,
                          spec.units_per_sample), env, seen)

    def search_size(self, size: str, spec_at: Any, start: int, seed: int | None) -> Search:
        """The largest per-device batch (``size`` ``batch_size``), or value of a workload's
        size, that trains a few steps here, each probe a fresh launch (``spec_at(value)``
        gives its spec), from ``seed`` (what an earlier run found) where there is one, else
        from ``start``."""
        case = self.case
        probe_protocol = Protocol(warmup_steps=PROBE_STEPS - 1, steps=1, repeats=1,
                                  name="probe")
        label = "batch-size" if size == BATCH else size

        def fits(value: int) -> Probe:
            # A probe asks whether the value trains as the measurement will: one diagnostic
            # step where the measurement runs them (docs/phases.md), whose memory the training
            # steps do not hold (torch's separate all-reduce: a copy of every gradient, 164 MB
            # for InsightFace's head at 80k classes, data parallel).
            spec = spec_at(value)
            spec = replace(spec, protocol=probe_protocol, phase_steps=min(1, spec.phase_steps))
            started = time.perf_counter()
            shown = f"{label} probe {value}"
            try:
                case.cluster.run(spec, self.watch(shown, windows=False))
            except LaunchError as exc:
                seconds = time.perf_counter() - started
                if exc.kind != "out_of_memory":
                    fail(f"pytest-dlperf: {case.id}: the {label} search's probe at "
                         f"{what(size, value)} failed, and not for lack of memory, on "
                         f"{case.cluster.topology.id}: {exc}")
                self._note(shown, f"out of memory ({seconds:.0f} s)")
                return Probe(value, False, seconds, _first_line(exc))
            seconds = time.perf_counter() - started
            self._note(shown, f"fits ({seconds:.0f} s)")
            return Probe(value, True, seconds)

        try:
            return search(fits, seed or start, seeded=seed is not None, size=size,
                          budget_s=case.state.settings.search_budget)
        except BatchSearchError as exc:
            fail(f"pytest-dlperf: {case.id}: {search_flag(size)}: {exc} (on "
                 f"{case.cluster.topology.id}; --dlperf-memory-limit "
                 f"{case.state.settings.memory_limit or 'none'})")

    def reference(self, spec: RankSpec, topology: Topology,
                  cluster: Cluster | None = None) -> float:
        """Measure the 1n1d reference now (not reported): the same per-device batch, its
        learning rate scaled to the one device's global batch; on ``cluster``'s launcher and
        interpreters (default: the case's)."""
        return self.reference_result(spec, topology, cluster).median

    def reference_result(self, spec: RankSpec, topology: Topology,
                         cluster: Cluster | None = None, at_the_edge: bool = False) -> Result:
        """``reference``'s whole result (its phases too). ``at_the_edge``: out of memory, it
        raises ``OutOfMemoryAtTheEdge`` (one device alone may not fit what the case's ranks
        share, sharded tables; the case is measured all the same) instead of failing."""
        return self.run((cluster or self.case.cluster).at(topology), self.reference_spec(spec),
                        at_the_edge=at_the_edge, label="1n1d reference")[0]

    def reference_spec(self, spec: RankSpec) -> RankSpec:
        """What the 1n1d reference of a case of ``spec`` trains: one device alone, whatever the
        case's layout, what it does without any parallel machinery (DLPerf's speedup's
        denominator), its learning rate scaled to the one device's global batch."""
        replicas = spec.parallel(self.case.cluster.world_size).data_parallel
        return replace(spec, optimizer=spec.optimizer.for_batch_ratio(1 / replicas),
                       layout=None)
