"""``--dlperf-batch-size max``: the largest per-device batch that trains without running out of
memory, found by doubling then bisection. A pure function of a ``fits(batch) -> bool`` probe,
so every branch is tested on numbers alone; ``measure`` runs each probe as a fresh launch of the
case's processes (an out-of-memory error can leave a CUDA context unusable).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The largest batch the search tries: past it, the case says the search hit the cap (a model
# that fits any batch is not probing memory).
MAX_BATCH = 1 << 16
# How many times the measurement may step down from a found batch that ran out of memory there.
MAX_RETREATS = 2


class BatchSearchError(RuntimeError):
    """The search cannot give a batch: even batch 1 ran out of memory."""


@dataclass
class Probe:
    batch: int
    fits: bool
    seconds: float = 0.0
    message: str = ""  # why it did not fit (the rank's out-of-memory error, first line)
    stage: str = "probe"  # or "measurement": the protocol's run at a found batch

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "fits": self.fits, "seconds": round(self.seconds, 3),
                "message": self.message, "stage": self.stage}


@dataclass
class Search:
    found: int
    start: int
    seeded: bool  # started from a batch an earlier run found
    probes: list[Probe] = field(default_factory=list)
    capped: bool = False  # every probe fitted up to MAX_BATCH

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.probes)

    def retreat(self, seconds: float, message: str) -> int:
        """The measurement at ``found`` ran out of memory although a probe there fitted: at the
        edge, a batch does not fit every time (allocators, threads, fragmentation move memory
        by more than a sample's share). Record it and step one down (its probe fitted, or a
        larger one did), at most ``MAX_RETREATS`` times; the new ``found``."""
        self.probes.append(Probe(self.found, False, seconds, message, stage="measurement"))
        retreats = sum(p.stage == "measurement" for p in self.probes)
        if self.found <= 1 or retreats > MAX_RETREATS:
            tried = ", ".join(str(p.batch) for p in self.probes if p.stage == "measurement")
            raise BatchSearchError(
                f"the search found {self.found + retreats - 1}, but the measurement ran out of "
                f"memory at batch {tried} (its probes had fitted): memory use is not steady "
                f"here; the last: {message}")
        self.found -= 1
        return self.found

    def to_json(self) -> dict[str, Any]:
        return {"found": self.found, "start": self.start, "seeded": self.seeded,
                "capped": self.capped, "seconds": round(self.seconds, 3),
                "probes": [p.to_json() for p in self.probes]}


def search(fits: Callable[[int], Probe], start: int, *, seeded: bool = False,
           cap: int = MAX_BATCH) -> Search:
    """The largest batch ``b`` with ``fits(b)`` and not ``fits(b + 1)``, assuming memory grows
    with the batch. From ``start``: while it fits, double (from a seed, an earlier run's
    answer, try one more first: if nothing changed, two probes settle it); once a batch does
    not fit, halve until one does; then bisect between the largest fit and the smallest
    failure."""
    if start < 1:
        raise ValueError(f"the search starts from a batch of at least 1, got {start}")
    result = Search(found=0, start=start, seeded=seeded)
    tried: dict[int, bool] = {}

    def probe(batch: int) -> bool:
        if batch not in tried:
            outcome = fits(batch)
            result.probes.append(outcome)
            tried[batch] = outcome.fits
        return tried[batch]

    start = min(start, cap)
    if probe(start):
        low, high = start, None
        candidate = start + 1 if seeded else start * 2
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
                raise BatchSearchError(f"even batch 1 ran out of memory{': ' + first if first else ''}")
            if probe(candidate):
                low = candidate
            else:
                high = candidate
                candidate //= 2
    while high - low > 1:
        middle = (low + high) // 2
        if probe(middle):
            low = middle
        else:
            high = middle
    result.found = low
    return result
