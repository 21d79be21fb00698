"""``--dlperf-batch-size max`` and ``--dlperf-size NAME=max``: the largest per-device batch, or
the largest value of a workload's size (a table's rows, a head's classes), that trains without
running out of memory, found by doubling then bisection. A pure function of a ``fits(value) ->
Probe`` probe, so every branch is tested on numbers alone; ``measure`` runs each probe as a fresh
launch of the case's processes (an out-of-memory error can leave a CUDA context unusable).

The batch is found exactly; another size to within ``precision`` of its value (1/64: a
vocabulary of millions is not searched to the row), which saves the bisection's last probes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The largest batch the search tries: past it, the case says the search hit the cap (a model
# that fits any batch is not probing memory).
MAX_BATCH = 1 << 16
# How many times the measurement may step down from a found value that ran out of memory there:
# by one resolution, then two, four and eight (found - 1, - 3, - 7, - 15). Memory at the edge
# moves between launches by more than one resolution of a large size: InsightFace's two ranks
# at 176,000 classes peaked 3.60-3.71 GB launch to launch (2026-12-01), ~12 of its 1/64 steps.
MAX_RETREATS = 4


# The search's time budget by default (--dlperf-search-budget): once a value has fitted and the
# probes have taken this long, the search stops with the largest value that fitted, saying so.
# InsightFace's class search under a 3G limit took 263 s of probes (2026-12-06).
DEFAULT_BUDGET_S = 600.0

BATCH = "batch_size"
# A size other than the batch is found to within this share of its value.
PRECISION = 1 / 64
# The largest value of another size the search tries (a table of 10^12 rows is no probe).
MAX_SIZE = 10 ** 12


class BatchSearchError(RuntimeError):
    """The search cannot give a value: even 1 ran out of memory."""


def what(size: str, value: int | str) -> str:
    """``batch 37`` for the batch, ``vocab=3200000`` for another size: as messages say it."""
    return f"batch {value}" if size == BATCH else f"{size}={value}"


def search_flag(size: str) -> str:
    """The option that asked for the search, as messages name it."""
    return "--dlperf-batch-size max" if size == BATCH else f"--dlperf-size {size}=max"


@dataclass
class Probe:
    batch: int  # the value probed: the batch, or the size's (the field keeps its first name)
    fits: bool
    seconds: float = 0.0
    message: str = ""  # why it did not fit (the rank's out-of-memory error, first line)
    stage: str = "probe"  # or "measurement": the protocol's run at a found value

    @property
    def value(self) -> int:
        return self.batch

    def to_json(self, key: str = "batch") -> dict[str, Any]:
        return {key: self.batch, "fits": self.fits, "seconds": round(self.seconds, 3),
                "message": self.message, "stage": self.stage}


@dataclass
class Search:
    found: int
    start: int
    seeded: bool  # started from a value an earlier run found
    probes: list[Probe] = field(default_factory=list)
    capped: bool = False  # every probe fitted up to the cap
    size: str = BATCH  # what was searched: the batch, or a size of the workload
    precision: float = 0.0  # found to within this share of its value (0: exactly)
    budget_s: float | None = None  # the probes' time budget; None: none
    # the budget ran out before the search settled: ``found`` is the largest value that fitted,
    # and ``unsettled`` the smallest that did not (None: every probe fitted)
    budget_spent: bool = False
    unsettled: int | None = None

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.probes)

    def step(self, value: int) -> int:
        """The resolution at ``value``: 1 for the batch, ``precision`` of it otherwise."""
        return max(1, int(value * self.precision))

    def retreat(self, seconds: float, message: str) -> int:
        """The measurement at ``found`` ran out of memory although a probe there fitted: at the
        edge, a value does not fit every time (allocators, threads, fragmentation move memory
        by more than a sample's share). Record it and step down (its probe fitted, or a larger
        one did): one resolution, then twice as far each time, at most ``MAX_RETREATS``
        times; the new ``found``."""
        self.probes.append(Probe(self.found, False, seconds, message, stage="measurement"))
        tried = [p.batch for p in self.probes if p.stage == "measurement"]
        if self.found <= 1 or len(tried) > MAX_RETREATS:
            raise BatchSearchError(
                f"the search found {tried[0]}, but the measurement ran out of memory at "
                f"{what(self.size, ', '.join(map(str, tried)))} (its probes had fitted): memory "
                f"use is not steady here; the last: {message}")
        self.found = max(1, self.found - self.step(tried[0]) * 2 ** (len(tried) - 1))
        return self.found

    def missed(self, seconds: float, message: str) -> None:
        """A launch of the measurement at ``found`` ran out of memory after others had fitted
        there: recorded, and run again at the same value (the launches that fitted kept)."""
        self.probes.append(Probe(self.found, False, seconds, message, stage="measurement, rerun"))

    @property
    def record_key(self) -> str:
        """Where a results entry and a baseline's record keep it: the batch's search as ever,
        another size's apart (its value is in the sizes)."""
        return "batch_search" if self.size == BATCH else "size_search"

    def to_json(self) -> dict[str, Any]:
        key = "batch" if self.size == BATCH else "value"
        return {"found": self.found, "start": self.start, "seeded": self.seeded,
                "capped": self.capped, "seconds": round(self.seconds, 3),
                "budget_s": self.budget_s, "budget_spent": self.budget_spent,
                "unsettled": self.unsettled,
                **({} if self.size == BATCH else {"size": self.size,
                                                  "precision": self.precision}),
                "probes": [p.to_json(key) for p in self.probes]}


class _BudgetSpent(Exception):
    """The probes took the search's budget, and a value has fitted."""


def search(fits: Callable[[int], Probe], start: int, *, seeded: bool = False,
           cap: int | None = None, size: str = BATCH, precision: float | None = None,
           budget_s: float | None = None) -> Search:
    """The largest value ``v`` of ``size`` with ``fits(v)`` and not ``fits(v + step)``, assuming
    memory grows with it (``step``: 1 for the batch, ``precision`` of ``v`` for another size).
    From ``start``: while it fits, double (from a seed, an earlier run's answer, try one step
    more first: if nothing changed, two probes settle it); once a value does not fit, halve
    until one does; then bisect between the largest fit and the smallest failure.
    ``budget_s``: once a value has fitted and the probes have taken this long, stop with the
    largest value that fitted (``budget_spent``; until one fits the search goes on)."""
    if start < 1:
        raise ValueError(f"the search starts from a value of at least 1, got {start}")
    if precision is None:
        precision = 0.0 if size == BATCH else PRECISION
    if cap is None:
        cap = MAX_BATCH if size == BATCH else MAX_SIZE
    result = Search(found=0, start=start, seeded=seeded, size=size, precision=precision,
                    budget_s=budget_s)
    tried: dict[int, bool] = {}

    def probe(batch: int) -> bool:
        if batch not in tried:
            fitted = [v for v, ok in tried.items() if ok]
            if budget_s is not None and fitted and result.seconds >= budget_s:
                result.found, result.budget_spent = max(fitted), True
                failed = [v for v, ok in tried.items() if not ok and v > result.found]
                result.unsettled = min(failed) if failed else None
                raise _BudgetSpent
            outcome = fits(batch)
            result.probes.append(outcome)
            tried[batch] = outcome.fits
        return tried[batch]

    try:
        return _settle(result, probe, start, cap, seeded)
    except _BudgetSpent:
        return result


def _settle(result: Search, probe: Callable[[int], bool], start: int, cap: int,
            seeded: bool) -> Search:
    """``search``'s probes in order: up (or down) to a fit and a failure, then between them."""
    size = result.size
    start = min(start, cap)
    if probe(start):
        low, high = start, None
        candidate = start + result.step(start) if seeded else start * 2
        while high is None:
            if candidate > cap:
                result.found, result.capped = low, True
                return result
            if probe(candidate):
                low = candidate
                candidate *= 2
            else:
                high = candidate
    else:
        high = start
        low = 0
        candidate = start // 2
        while low == 0:
            if candidate < 1:
                first = result.probes[-1].message if result.probes else ""
                raise BatchSearchError(f"even {what(size, 1)} ran out of memory"
                                       f"{': ' + first if first else ''}")
            if probe(candidate):
                low = candidate
            else:
                high = candidate
                candidate //= 2
    while high - low > result.step(low):
        middle = (low + high) // 2
        if probe(middle):
            low = middle
        else:
            high = middle
    result.found = low
    return result
