"""Where a step's time goes: the phases of the diagnostic steps a rank runs after its timed
windows (``pytest_dlperf.rank.phases``), and their figures over a case's ranks and launches.

The DLPerf windows stay pure: a device wait between phases would serialize what a framework
overlaps (DDP's all-reduce behind backward, the host queueing ahead of the device), so the
phases are timed in separate steps, a wait after each phase. Exposed communication is measured,
not guessed: the same diagnostic steps run in pairs, once with the framework's gradient
communication and once without it; the difference of the pair's whole steps is what the
communication costs the step. Hidden communication is what a separate all-reduce of the
gradients' bytes (alone, nothing beside it) takes, less the exposed part.

Standard library only: ranks import it under any Python 3.10+.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DATA = "data"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
REST = "rest"
EXPOSED = "exposed communication"
# The phases of a step a framework can run apart, in the order a step runs them. An adapter
# may merge neighbours into one (``"forward+backward+optimizer"``: a compiled whole-step graph).
STANDARD = (DATA, FORWARD, BACKWARD, OPTIMIZER)
# What a phase's change must reach before a verdict names it: a part of the phase itself, of
# the whole step (a phase of 2 ms going to 3 ms is +50% and moves nothing), and of the step's
# own change (where backward took 100 ms more, forward's 3 ms of a busy host's noise is not
# where the time went).
MOVED_OF_PHASE = 0.10
MOVED_OF_STEP = 0.03
MOVED_OF_CHANGE = 0.20


def diagnostic_steps(steps_per_window: int) -> int:
    """Diagnostic steps per launch (each run twice on several ranks: with and without
    communication): a fifth of a window, 2 to 10. The quick profile's 10-step windows give 2
    (4 steps beside its 55 per launch), DLPerf's 100-step windows 10 (20 beside 720)."""
    return max(2, min(10, steps_per_window // 5))


def merged(names: Sequence[str]) -> str:
    """The name of neighbouring phases run as one: ``forward+backward+optimizer``."""
    return "+".join(names)


@dataclass
class PhaseSamples:
    """A case's raw phase timings, pooled over its ranks and launches (seconds per step)."""

    order: list[str] = field(default_factory=list)  # the phases, as the step runs them
    # Each phase's seconds in every diagnostic step without communication (with it where the
    # communication cannot be switched off or there is none), every rank's.
    phases: dict[str, list[float]] = field(default_factory=dict)
    step_with: list[float] = field(default_factory=list)  # whole diagnostic steps, communicating
    exposed: list[float] = field(default_factory=list)  # with - without, pair by pair
    all_reduce_s: list[float] = field(default_factory=list)  # the gradients alone, all-reduced
    ping_s: list[float] = field(default_factory=list)  # one element all-reduced: latency
    gradient_bytes: int = 0
    buckets: int = 0
    how: str = ""
    note: str = ""

    @classmethod
    def of(cls, rank_results: Sequence[Mapping[str, Any]]) -> PhaseSamples | None:
        """From one launch's rank results (``rank.worker``); None where no rank ran phases."""
        found = [r["phases"] for r in rank_results if r.get("phases")]
        if not found:
            return None
        samples = cls(order=list(found[0]["order"]), gradient_bytes=int(found[0]["gradient_bytes"]),
                      buckets=int(found[0]["buckets"]), how=str(found[0]["how"]),
                      note=str(found[0]["note"]))
        for rank in found:
            steps = rank["without"] or rank["with"]
            for name in samples.order + [REST]:
                samples.phases.setdefault(name, []).extend(s[name] for s in steps)
            samples.step_with.extend(s["step"] for s in rank["with"])
            samples.exposed.extend(rank.get("exposed_s") or [])
            samples.all_reduce_s.extend(rank.get("all_reduce_s") or [])
            samples.ping_s.extend(rank.get("ping_s") or [])
        return samples

    def extended(self, more: PhaseSamples | None) -> PhaseSamples:
        if more is None:
            return self
        return PhaseSamples(
            self.order, {k: v + more.phases.get(k, []) for k, v in self.phases.items()},
            self.step_with + more.step_with, self.exposed + more.exposed,
            self.all_reduce_s + more.all_reduce_s, self.ping_s + more.ping_s,
            self.gradient_bytes, self.buckets, self.how, self.note)

    def figures(self) -> Phases:
        seconds = {name: statistics.median(self.phases[name]) for name in self.order + [REST]
                   if self.phases.get(name)}
        exposed = max(0.0, statistics.median(self.exposed)) if self.exposed else None
        if exposed is not None:
            seconds[EXPOSED] = exposed
        communication = statistics.median(self.all_reduce_s) if self.all_reduce_s else None
        return Phases(
            seconds=seconds, order=[*self.order, REST] + ([EXPOSED] if exposed is not None
                                                          else []),
            step_s=statistics.median(self.step_with) if self.step_with else None,
            communication_s=communication,
            latency_s=statistics.median(self.ping_s) if self.ping_s else None,
            gradient_bytes=self.gradient_bytes, buckets=self.buckets, how=self.how,
            note=self.note, samples=len(self.step_with))


@dataclass(frozen=True)
class Phases:
    """A case's phases: the median seconds per step of each, and the communication's."""

    seconds: dict[str, float]
    order: list[str]
    step_s: float | None = None  # a diagnostic step with communication, whole, waits included
    communication_s: float | None = None  # the gradients all-reduced alone
    latency_s: float | None = None  # one element all-reduced
    gradient_bytes: int = 0
    buckets: int = 0
    how: str = ""
    note: str = ""
    samples: int = 0

    @property
    def exposed_s(self) -> float | None:
        return self.seconds.get(EXPOSED)

    @property
    def hidden_s(self) -> float | None:
        """Communication time that backward (or whatever ran beside it) covered."""
        if self.communication_s is None or self.exposed_s is None:
            return None
        return max(0.0, self.communication_s - self.exposed_s)

    @property
    def overlap(self) -> float | None:
        """Hidden / total communication, 0 to 1 (the HKBU evaluation's comparison)."""
        hidden = self.hidden_s
        if hidden is None or not self.communication_s:
            return None
        return min(1.0, hidden / self.communication_s)

    @property
    def compute_s(self) -> float:
        """The step without its exposed communication."""
        return sum(v for k, v in self.seconds.items() if k != EXPOSED)

    def to_json(self) -> dict[str, Any]:
        return {"seconds_per_step": dict(self.seconds), "order": list(self.order),
                "diagnostic_step_s": self.step_s, "communication_s": self.communication_s,
                "hidden_s": self.hidden_s, "overlap": self.overlap,
                "latency_s": self.latency_s, "gradient_bytes": self.gradient_bytes,
                "buckets": self.buckets, "how": self.how, "note": self.note,
                "diagnostic_steps": self.samples}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Phases:
        return cls(seconds={str(k): float(v) for k, v in data["seconds_per_step"].items()},
                   order=list(data.get("order") or data["seconds_per_step"]),
                   step_s=data.get("diagnostic_step_s"),
                   communication_s=data.get("communication_s"),
                   latency_s=data.get("latency_s"),
                   gradient_bytes=int(data.get("gradient_bytes") or 0),
                   buckets=int(data.get("buckets") or 0), how=str(data.get("how") or ""),
                   note=str(data.get("note") or ""),
                   samples=int(data.get("diagnostic_steps") or 0))
