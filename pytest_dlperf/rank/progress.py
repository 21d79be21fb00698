"""Live progress of a running case, the rank's side: rank 0 appends its phases to a file that the
pytest side (``plugin.live.LiveLine``) follows and shows.

``RankProgress`` writes one JSON line per event: started (rendezvous and model build under way),
the first warm-up step and the warm-up's end, each timed window with its samples/s. Every write
happens where the meter is not timing and the device has just been synchronized
(``rank.timing.measure``'s ``progress`` hook), so the windows carry no extra work and no write
runs beside queued asynchronous work (``benchmarks/overhead.py`` measures it). ``describe`` says
what an event means, for the line the pytest side shows.
"""

from __future__ import annotations

import json
from typing import Any, TextIO


class RankProgress:
    """Rank 0's side: appends events to ``path``; every write flushed, one line each."""

    def __init__(self, path: str, samples_per_step: int, unit: str) -> None:
        self.samples_per_step, self.unit = samples_per_step, unit
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed below)

    def event(self, phase: str, index: int = 0, total: int = 0,
              elapsed_s: float | None = None, steps: int = 0) -> None:
        record: dict[str, Any] = {"phase": phase, "index": index, "total": total}
        if elapsed_s:
            record["samples_per_s"] = self.samples_per_step * steps / elapsed_s
            record["unit"] = self.unit
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def describe(event: dict[str, Any]) -> str:
    phase = event.get("phase")
    if phase == "started":
        return "rendezvous and model build"
    if phase == "warmup":
        return f"warm-up {event['index']}/{event['total']}"
    if phase == "window":
        return (f"window {event['index']}/{event['total']} "
                f"{event['samples_per_s']:,.2f} {event.get('unit', 'samples')}/s")
    return str(phase)
