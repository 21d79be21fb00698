"""The meter inside a worker: exact window arithmetic on an injected clock, and honest timing of
asynchronous work (a device that returns before it is done must be waited for)."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from pytest_dlperf.core.protocol import Protocol, throughput
from pytest_dlperf.rank.timing import measure

pytestmark = pytest.mark.alone("it compares windows with a device's own timeline to a few percent, "
                               "and a loaded machine wakes the device's thread late")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_windows_on_an_injected_clock_are_exact() -> None:
    clock, log = FakeClock(), []

    def step() -> None:
        clock.now += 0.5
        log.append("step")

    def sync() -> None:
        clock.now += 0.25  # the device finishing queued work
        log.append("sync")

    result = measure(Protocol(warmup_steps=3, steps=4, repeats=2), step, sync, clock=clock)
    # The first warm-up step is timed on its own (compilation happens there), synchronized.
    assert result.first_step_s == pytest.approx(0.5 + 0.25)
    assert result.warmup_s == pytest.approx(3 * 0.5 + 2 * 0.25)
    assert [w.elapsed_s for w in result.windows] == pytest.approx([4 * 0.5 + 0.25] * 2)
    assert [w.steps for w in result.windows] == [4, 4]
    # Every window is closed by a synchronize, and the warm-up's queue is drained before it.
    assert log == ["step", "sync"] + ["step"] * 2 + ["sync"] + (["step"] * 4 + ["sync"]) * 2


def test_after_window_runs_outside_the_timed_region() -> None:
    clock = FakeClock()

    def slow_check(_: int) -> None:
        clock.now += 10.0  # a loss read that blocks must not be billed to any window

    result = measure(Protocol(0, 2, 3), lambda: setattr(clock, "now", clock.now + 1), lambda: None,
                     clock=clock, after_window=slow_check)
    assert [w.elapsed_s for w in result.windows] == [2.0, 2.0, 2.0]


class AsyncDevice:
    """Work is queued and returns at once, like CUDA or OneFlow eager; a thread executes it."""

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s
        self.work: queue.Queue[float | None] = queue.Queue()
        self.done_at: list[float] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.work.get()) is not None:
            time.sleep(item)
            self.done_at.append(time.perf_counter())
            self.work.task_done()
        self.work.task_done()

    def step(self) -> None:
        self.work.put(self.cost_s)

    def synchronize(self) -> None:
        self.work.join()

    def close(self) -> None:
        self.work.put(None)
        self.thread.join()


def test_window_throughput_agrees_with_the_device_timeline() -> None:
    device = AsyncDevice(cost_s=0.01)
    proto = Protocol(warmup_steps=5, steps=20, repeats=2)
    try:
        result = measure(proto, device.step, device.synchronize)
    finally:
        device.close()
    # Outside view: when the device really finished the last warm-up step and each window.
    ends = [device.done_at[proto.warmup_steps - 1 + proto.steps * (i + 1)] for i in range(2)]
    starts = [device.done_at[proto.warmup_steps - 1], ends[0]]
    for window, start, end in zip(result.windows, starts, ends):
        assert throughput(2, 20, window.elapsed_s) == pytest.approx(
            throughput(2, 20, end - start), rel=0.05)


def test_without_synchronize_the_same_device_looks_impossibly_fast() -> None:
    """Why the meter synchronizes: skip it and a 10 ms step reads as ~free."""
    device = AsyncDevice(cost_s=0.01)
    try:
        result = measure(Protocol(0, 20, 1), device.step, lambda: None)
        device.synchronize()
    finally:
        device.close()
    assert result.windows[0].elapsed_s < 0.2 * 20 * 0.01


def test_real_torch_window_agrees_with_an_outside_wall_clock() -> None:
    """A real ResNet-50 step on CPU through the torch adapter: the window the meter reports and a
    stopwatch around the whole measurement (which waits for the device at the end) agree."""
    pytest.importorskip("torchvision")
    from pytest_dlperf.core.protocol import QUICK
    from pytest_dlperf.core.spec import spec_for
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.models import RESNET50
    from pytest_dlperf.rank.worker import build

    trainer = build(spec_for("torch", RESNET50, protocol=QUICK, device_type="cpu"),
                    DistEnv(0, 1, 0, 1, 0))
    try:
        trainer.step()  # first-touch allocation, outside both timings
        begin = time.perf_counter()
        result = measure(Protocol(0, 8, 1), trainer.step, trainer.synchronize)
        outside = time.perf_counter() - begin
    finally:
        trainer.close()
    assert throughput(2, 8, result.windows[0].elapsed_s) == pytest.approx(
        throughput(2, 8, outside), rel=0.03)
