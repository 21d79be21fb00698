"""Timing inside a worker: the protocol's windows around a framework's training step.

Runs in every training rank: standard library only, and no pytest. The clock is injectable so the
window arithmetic can be tested exactly; ``synchronize`` waits for the device, because CUDA and
OneFlow (even on CPU) return from a step before its work is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..core.protocol import Protocol


@dataclass
class Window:
    """One timed window: ``steps`` training steps that took ``elapsed_s`` on this rank."""

    steps: int
    elapsed_s: float


@dataclass
class Measurement:
    warmup_s: float
    windows: list[Window] = field(default_factory=list)
    # The first warm-up step alone: where tracing and compilation (a compiled case's, a
    # tf.function's first trace) happen. Reported on its own, never part of a window.
    first_step_s: float = 0.0
    # Wall-clock (epoch) time the first timed step began: start-up figures across processes.
    timed_from: float = 0.0

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def measure(
    protocol: Protocol,
    step: Callable[[], None],
    synchronize: Callable[[], None],
    *,
    clock: Callable[[], float] = time.perf_counter,
    after_window: Callable[[int], None] | None = None,
    before_window: Callable[[int], None] | None = None,
    epoch: Callable[[], float] = time.time,
    progress: Callable[[str, int, int, float | None], None] | None = None,
) -> Measurement:
    """Run the warm-up once, then ``protocol.repeats`` windows of ``protocol.steps`` steps.

    Each window starts and ends on a synchronized device, so queued work from the warm-up or the
    previous window is never counted in (or left out of) the next one. ``after_window`` runs
    outside the timed region (a loss check reads device memory and would itself synchronize),
    and so does ``before_window`` (resetting peak-memory counters). So does ``progress``
    (phase, index from 1, total, a window's seconds or None), and only where the device has
    just been synchronized, so it never runs beside queued work (OneFlow's nn.Graph, CUDA):
    after the first warm-up step (where compilation happens), at the end of the warm-up, and
    after each window once its clock has stopped.
    """
    started = clock()
    first_step_s = 0.0
    for index in range(protocol.warmup_steps):
        step()
        if index == 0:
            synchronize()
            first_step_s = clock() - started
            if progress is not None:
                progress("warmup", 1, protocol.warmup_steps, None)
    synchronize()
    if progress is not None and protocol.warmup_steps > 1:
        progress("warmup", protocol.warmup_steps, protocol.warmup_steps, None)
    result = Measurement(warmup_s=clock() - started, timed_from=epoch(),
                         first_step_s=first_step_s)
    for index in range(protocol.repeats):
        if before_window is not None:
            before_window(index)
        begin = clock()
        for _ in range(protocol.steps):
            step()
        synchronize()
        result.windows.append(Window(steps=protocol.steps, elapsed_s=clock() - begin))
        if after_window is not None:
            after_window(index)
            synchronize()
        if progress is not None:
            progress("window", index + 1, protocol.repeats, result.windows[-1].elapsed_s)
    return result
