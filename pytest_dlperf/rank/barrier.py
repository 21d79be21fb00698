"""Duet A/B's barrier (``--dlperf-ab-mode duet``): the ranks of both sides, two jobs running at
once on halves of one host, meet before each timed window, so that window k of each side covers
the same wall time and sees the same interference. A folder of marker files in the launch's
work dir: each rank adds its own to a phase's folder and waits until every party's is there.

Runs in every training rank: standard library only, no pytest. A rank that fails leaves a
``broken-*`` marker, so the other side stops waiting at once; a side that never comes is a
``BarrierError`` after the timeout, naming the barrier, instead of a hang.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Between looks at the folder: the two sides' windows start this far apart at most, against
# windows of a tenth of a second and more; a waiting rank's looks cost next to nothing.
POLL_S = 0.001


class BarrierError(RuntimeError):
    """The other side did not come to the barrier, or failed."""


@dataclass
class Barrier:
    folder: Path
    parties: int
    timeout_s: float
    name: str  # this rank's marker, unique on the host (its process id)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def wait(self, phase: str) -> None:
        here = self.folder / phase
        here.mkdir(parents=True, exist_ok=True)
        (here / self.name).touch()
        deadline = self.clock() + self.timeout_s
        while True:
            arrived = len(os.listdir(here))
            if arrived >= self.parties:
                return
            broken = sorted(self.folder.glob("broken-*"))
            if broken:
                raise BarrierError(
                    f"duet barrier {self.folder} ({phase}): a rank of the other side failed "
                    f"while this one waited: {broken[0].read_text().strip()[:300]}")
            if self.clock() > deadline:
                raise BarrierError(
                    f"duet barrier {self.folder} ({phase}): {arrived} of {self.parties} ranks "
                    f"arrived within {self.timeout_s:g} s; the other side never came (it "
                    "died, or hung before its windows)")
            self.sleep(POLL_S)

    def break_(self, why: str) -> None:
        """Tell the waiting ranks this one will not come."""
        # Written under a name nobody looks for, then renamed: a waiting rank polls every
        # millisecond and once read the marker before its reason was in it (a blank reason).
        writing = self.folder / f".writing-broken-{self.name}"
        try:
            writing.write_text(why)
            os.replace(writing, self.folder / f"broken-{self.name}")
        except OSError:
            pass  # the folder went with its launch: nobody waits there any more


def of(spec: dict[str, object]) -> Barrier | None:
    """The barrier a rank spec (as JSON) names, if any."""
    folder = spec.get("barrier")
    if not folder:
        return None
    return Barrier(Path(str(folder)), int(str(spec.get("barrier_parties") or 0)),
                   float(str(spec.get("barrier_timeout_s") or 600.0)), str(os.getpid()))
