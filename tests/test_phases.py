"""Where the step's time went (issue 41), the arithmetic: the diagnostic steps' driver on an
injected clock, the figures pooled over ranks and launches, which phases a verdict names, and
the scaling model. No training here (tests/test_phases_e2e.py trains)."""

from __future__ import annotations

import pytest

from pytest_dlperf.core.phases import (
    BACKWARD,
    DATA,
    EXPOSED,
    FORWARD,
    OPTIMIZER,
    REST,
    Phases,
    PhaseSamples,
    diagnostic_steps,
)
from pytest_dlperf.frameworks import PhasePlan
from pytest_dlperf.rank.phases import diagnose
from pytest_dlperf.verdict import phases as moved_phases
from pytest_dlperf.verdict import scaling


class Clock:
    """A clock that only the phases advance."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def plan_on(clock: Clock, communication_s: float, *, switchable: bool = True) -> PhasePlan:
    """A step of data 0.01, forward 0.1, backward 0.2 (+ the exposed communication when on),
    optimizer 0.05 seconds."""
    state = {"on": True}

    def phase(seconds: float, communicated: bool = False) -> object:
        return lambda: clock.advance(seconds + (communication_s if communicated and state["on"]
                                                else 0.0))

    def switch(on: bool) -> None:
        state["on"] = on

    return PhasePlan([(DATA, phase(0.01)), (FORWARD, phase(0.1)),
                      (BACKWARD, phase(0.2, communicated=True)), (OPTIMIZER, phase(0.05))],
                     communicate=switch if switchable else None,
                     all_reduce=lambda: clock.advance(0.3), ping=lambda: clock.advance(0.001),
                     gradient_bytes=1000, buckets=2, how="test switch")


def test_exposed_communication_is_the_pairs_difference_and_hidden_the_rest() -> None:
    clock = Clock()
    rank = diagnose(plan_on(clock, 0.12), lambda: None, 4, communicating=True, clock=clock)
    assert len(rank["with"]) == len(rank["without"]) == 4
    assert rank["exposed_s"] == pytest.approx([0.12] * 4)
    figures = PhaseSamples.of([{"phases": rank}, {"phases": rank}]).figures()
    assert figures.seconds[BACKWARD] == pytest.approx(0.2)  # without the communication
    assert figures.exposed_s == pytest.approx(0.12)
    assert figures.communication_s == pytest.approx(0.3)
    assert figures.hidden_s == pytest.approx(0.18)
    assert figures.overlap == pytest.approx(0.6)
    assert figures.order == [DATA, FORWARD, BACKWARD, OPTIMIZER, REST, EXPOSED]
    assert figures.compute_s == pytest.approx(0.36)


def test_pairs_alternate_which_runs_first() -> None:
    """A drifting machine (each step a little slower than the last) must not bias the pair's
    difference one way: the order alternates, so the drift cancels over the pairs."""
    clock = Clock()
    seen: list[bool] = []
    plan = plan_on(clock, 0.0)
    switch = plan.communicate
    assert switch is not None
    plan.communicate = lambda on: (seen.append(on), switch(on))[1]
    diagnose(plan, lambda: None, 4, communicating=True, clock=clock)
    assert seen[0] is False  # the untimed step, without communication
    timed = seen[1:-1]  # before switching back on
    assert timed == [True, False, False, True, True, False, False, True]
    assert seen[-1] is True  # training's own state again


def test_without_a_switch_or_peers_no_exposed_figure_is_invented() -> None:
    clock = Clock()
    alone = diagnose(plan_on(clock, 0.12), lambda: None, 3, communicating=False, clock=clock)
    assert alone["without"] is None and alone["exposed_s"] is None
    assert alone["all_reduce_s"] is None and alone["how"] == "one rank: no communication"
    sharded = diagnose(plan_on(clock, 0.12, switchable=False), lambda: None, 3,
                       communicating=True, clock=clock)
    figures = PhaseSamples.of([{"phases": sharded}]).figures()
    assert EXPOSED not in figures.seconds and figures.overlap is None
    # The communication stays inside backward, where it ran.
    assert figures.seconds[BACKWARD] == pytest.approx(0.32)


def test_a_wait_after_every_phase() -> None:
    """Each phase is timed to a synchronized device: a phase that returns before its work is
    done (CUDA, OneFlow) is charged its own work, not the next phase's."""
    clock = Clock()
    queued: list[float] = []
    plan = PhasePlan([(FORWARD, lambda: queued.append(0.1)),
                      (BACKWARD, lambda: queued.append(0.2))])

    def synchronize() -> None:
        while queued:
            clock.advance(queued.pop())

    rank = diagnose(plan, synchronize, 2, communicating=False, clock=clock)
    assert [s[FORWARD] for s in rank["with"]] == pytest.approx([0.1, 0.1])
    assert [s[BACKWARD] for s in rank["with"]] == pytest.approx([0.2, 0.2])


def test_launches_pool_and_json_round_trips() -> None:
    clock = Clock()
    one = PhaseSamples.of([{"phases": diagnose(plan_on(clock, 0.1), lambda: None, 2,
                                               communicating=True, clock=clock)}])
    other = PhaseSamples.of([{"phases": diagnose(plan_on(clock, 0.3), lambda: None, 2,
                                                 communicating=True, clock=clock)}])
    assert one is not None and other is not None
    both = one.extended(other)
    assert len(both.exposed) == 4 and len(both.phases[FORWARD]) == 4
    figures = both.figures()
    assert figures.exposed_s == pytest.approx(0.2)  # the median of 0.1, 0.1, 0.3, 0.3
    assert Phases.from_json(figures.to_json()) == figures
    assert PhaseSamples.of([{"rank": 0}]) is None


@pytest.mark.parametrize(("steps", "expected"), [(10, 2), (100, 10), (1, 2), (40, 8)])
def test_diagnostic_steps_are_a_fifth_of_a_window_2_to_10(steps: int, expected: int) -> None:
    assert diagnostic_steps(steps) == expected


def phases(**seconds: float) -> Phases:
    named = {name.replace("_", " "): value for name, value in seconds.items()}
    return Phases(seconds=named, order=list(named))


BEFORE = phases(data=0.001, forward=0.1, backward=0.2, optimizer=0.05, rest=0.0001,
                exposed_communication=0.05)


def test_a_slower_backward_is_named_and_forward_is_not() -> None:
    after = phases(data=0.001, forward=0.104, backward=0.26, optimizer=0.049, rest=0.0002,
                   exposed_communication=0.05)
    assert moved_phases.moved(BEFORE, after) == [BACKWARD]
    text = moved_phases.where(BEFORE, after)
    assert text is not None
    assert text.startswith("backward 0.2 -> 0.26 s/step (+30%)")
    assert text.endswith("data, forward, optimizer, rest, exposed communication unchanged")


def test_a_busy_hosts_noise_beside_a_large_change_is_not_named() -> None:
    """Backward took 0.5 s more; forward's +0.03 (15% of itself, 8% of the step) is a busy
    host's noise beside it, under a fifth of the step's change."""
    after = phases(data=0.001, forward=0.13, backward=0.7, optimizer=0.05, rest=0.0001,
                   exposed_communication=0.05)
    assert moved_phases.moved(BEFORE, after) == [BACKWARD]
    alone = phases(data=0.001, forward=0.13, backward=0.2, optimizer=0.05, rest=0.0001,
                   exposed_communication=0.05)
    assert moved_phases.moved(BEFORE, alone) == [FORWARD]


def test_tiny_phases_do_not_move_on_noise() -> None:
    """data 1 ms -> 2 ms is +100% of itself but under 3% of the step: unchanged."""
    after = phases(data=0.002, forward=0.1, backward=0.2, optimizer=0.05, rest=0.0001,
                   exposed_communication=0.05)
    assert moved_phases.moved(BEFORE, after) == []
    assert "no phase moved" in (moved_phases.where(BEFORE, after) or "")


def test_exposed_communication_is_named_when_the_link_slows() -> None:
    after = phases(data=0.001, forward=0.1, backward=0.2, optimizer=0.05, rest=0.0001,
                   exposed_communication=0.4)
    assert moved_phases.moved(BEFORE, after) == [EXPOSED]
    assert moved_phases.suffix(BEFORE, None) == ""
    assert "exposed communication 0.05 -> 0.4 s/step (+700%)" in moved_phases.suffix(BEFORE,
                                                                                     after)


def test_merged_phases_share_nothing_with_split_ones() -> None:
    graph = phases(data=0.001, **{"forward+backward+optimizer": 0.4})
    assert moved_phases.where(BEFORE, graph) == "no phase moved by 10% of itself and 3% of " \
        "the step (data)"
    assert moved_phases.where(phases(x=1.0), graph) is None


def test_ring_all_reduce_time() -> None:
    # 2 ranks: each sends and receives the gradients once: 100 MB at 1 Gbit/s = 0.8 s.
    assert scaling.ring_seconds(100e6, 2, 1e9) == pytest.approx(0.8)
    # 8 ranks: 2 x 7/8 of it, plus 4 buckets' latency.
    assert scaling.ring_seconds(100e6, 8, 1e9, 0.001, 4) == pytest.approx(1.4 + 0.004)
    assert scaling.ring_seconds(100e6, 1, 1e9) == 0.0


def many_devices(exposed: float, communication: float, backward: float = 0.2) -> Phases:
    return Phases(seconds={DATA: 0.0, FORWARD: 0.1, BACKWARD: backward, OPTIMIZER: 0.1,
                           EXPOSED: exposed},
                  order=[DATA, FORWARD, BACKWARD, OPTIMIZER, EXPOSED],
                  communication_s=communication, latency_s=0.0, gradient_bytes=100_000_000,
                  buckets=4)


ONE = Phases(seconds={DATA: 0.0, FORWARD: 0.1, BACKWARD: 0.2, OPTIMIZER: 0.1},
             order=[DATA, FORWARD, BACKWARD, OPTIMIZER])


def test_the_model_predicts_from_one_device_the_bytes_the_link_and_the_overlap() -> None:
    # Measured on 2 devices: 0.4 s of all-reduce alone, 0.1 exposed: 75% hidden.
    many = many_devices(exposed=0.1, communication=0.4)
    model = scaling.predict(ONE, many, 2, 1e9, "the link", measured_efficiency=0.5)
    assert model is not None
    assert model.communication_s == pytest.approx(0.8)  # 100 MB over 1 Gbit/s
    assert model.exposed_s == pytest.approx(0.2)  # a quarter of it exposed
    assert model.predicted_step_s == pytest.approx(0.6)
    assert model.predicted_efficiency == pytest.approx(0.4 / 0.6)
    assert model.ratio == pytest.approx(0.5 / (0.4 / 0.6))
    assert scaling.predict(ONE, many, 2, None, "") is None
    assert scaling.predict(ONE, phases(forward=1.0), 2, 1e9, "") is None  # no overlap known


def test_far_below_the_model_warns_naming_the_phase_out_of_line() -> None:
    slow_backward = many_devices(exposed=0.1, communication=0.4, backward=0.9)
    model = scaling.predict(ONE, slow_backward, 2, 1e9, "the link", measured_efficiency=0.3)
    assert model is not None
    warning = scaling.out_of_line(model, ONE, slow_backward)
    assert warning is not None
    assert "backward 0.9 s/step on 2 devices against 0.2 on one (4.50x)" in warning
    assert "forward" not in warning and "exposed" not in warning
    slow_link = many_devices(exposed=1.5, communication=1.6)
    model = scaling.predict(ONE, slow_link, 2, 1e9, "the link", measured_efficiency=0.2)
    assert model is not None
    warning = scaling.out_of_line(model, ONE, slow_link)
    assert warning is not None and "exposed communication 1.5 s/step" in warning
    close = scaling.predict(ONE, slow_link, 2, 1e9, "", measured_efficiency=0.5)
    assert close is not None and scaling.out_of_line(close, ONE, slow_link) is None


def test_a_cpu_rank_with_half_the_threads_is_half_a_device() -> None:
    """Two CPU ranks on the cores one 1n1d run had: each computes at half its speed, which
    the model expects (compute_scale 2) and does not call out of line."""
    halved = Phases(seconds={DATA: 0.0, FORWARD: 0.2, BACKWARD: 0.4, OPTIMIZER: 0.2,
                             EXPOSED: 0.1},
                    order=[DATA, FORWARD, BACKWARD, OPTIMIZER, EXPOSED], communication_s=0.4,
                    latency_s=0.0, gradient_bytes=100_000_000, buckets=4)
    model = scaling.predict(ONE, halved, 2, 1e9, "the link", measured_efficiency=0.4 / 1.0,
                            compute_scale=2.0)
    assert model is not None
    assert model.predicted_step_s == pytest.approx(0.8 + 0.2)
    assert model.predicted_efficiency == pytest.approx(0.4)
    assert scaling.out_of_line(model, ONE, halved) is None
    literal = scaling.predict(ONE, halved, 2, 1e9, "the link", measured_efficiency=0.4)
    assert literal is not None
    warning = scaling.out_of_line(literal, ONE, halved)
    assert warning is not None and "backward 0.4 s/step on 2 devices against 0.2 on one" in warning
