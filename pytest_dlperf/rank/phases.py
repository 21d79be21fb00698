"""The diagnostic steps after the timed windows: one training step cut into the phases the
adapter's ``PhasePlan`` names, a device wait after each (``pytest_dlperf.core.phases``).

Every rank runs the same sequence (its collectives must meet the other ranks'): an untimed
step without communication, then ``steps`` pairs of steps, one with the gradient communication and one
without (their order alternating, so that neither always runs first), each step begun on a
barrier (one element all-reduced) so that no rank's wait for a late peer counts as its own
phase. Then the gradients' bytes all-reduced alone, and one element alone (the latency).
Standard library only; no pytest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core.phases import REST
from ..frameworks import PhasePlan

ALL_REDUCE_REPEATS = 3
PING_REPEATS = 5


def phased_step(plan: PhasePlan, synchronize: Callable[[], None],
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """One training step, phase by phase, the device waited for after each: each phase's
    seconds, ``rest`` (what ran between them: the loop's own host time) and the whole
    ``step``."""
    if plan.ping is not None:
        plan.ping()
    synchronize()
    times: dict[str, float] = {}
    started = clock()
    for name, run in plan.phases:
        begin = clock()
        run()
        synchronize()
        times[name] = clock() - begin
    step = clock() - started
    times[REST] = max(0.0, step - sum(times.values()))
    times["step"] = step
    return times


def diagnose(plan: PhasePlan, synchronize: Callable[[], None], steps: int, *,
             communicating: bool,
             clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """The phases of ``steps`` diagnostic steps (pairs where the communication can be switched
    off and the rank has peers), as plain JSON for the rank's result."""
    switch = plan.communicate if communicating else None
    with_: list[dict[str, float]] = []
    without: list[dict[str, float]] = []
    exposed: list[float] = []
    if switch is not None:
        # Untimed: switching off may rebuild what the framework caches (a second trace); the
        # steps with communication ran all through the windows.
        switch(False)
        phased_step(plan, synchronize, clock)
        for index in range(steps):
            pair: dict[bool, float] = {}
            for on in ((True, False) if index % 2 == 0 else (False, True)):
                switch(on)
                times = phased_step(plan, synchronize, clock)
                (with_ if on else without).append(times)
                pair[on] = times["step"]
            exposed.append(pair[True] - pair[False])
        switch(True)
    else:
        phased_step(plan, synchronize, clock)  # untimed: its first may build or trace
        with_ = [phased_step(plan, synchronize, clock) for _ in range(steps)]
    return {"order": [name for name, _ in plan.phases], "with": with_,
            "without": without or None, "exposed_s": exposed or None,
            "all_reduce_s": _timed(plan.all_reduce, plan, synchronize, ALL_REDUCE_REPEATS,
                                   clock) if communicating else None,
            "ping_s": _timed(plan.ping, plan, synchronize, PING_REPEATS, clock)
            if communicating else None,
            "gradient_bytes": plan.gradient_bytes if communicating else 0,
            "buckets": plan.buckets if communicating else 0,
            "how": plan.how if communicating else "one rank: no communication",
            "note": plan.note}


def _timed(run: Callable[[], None] | None, plan: PhasePlan, synchronize: Callable[[], None],
           repeats: int, clock: Callable[[], float]) -> list[float] | None:
    """``run``'s seconds, each call begun on a barrier where the plan has one."""
    if run is None:
        return None
    run()  # untimed: the first call may set up what it needs
    synchronize()
    times = []
    for _ in range(repeats):
        if plan.ping is not None:
            plan.ping()
        synchronize()
        begin = clock()
        run()
        synchronize()
        times.append(clock() - begin)
    return times
