"""One machine's nights in the history (``--dlperf-history``): every series (a case and its
fingerprint) measured on this machine and device type under this protocol, each night with its
launches of one metric. Where no baseline of the machine holds two runs, its drift between runs
is pooled from them (``verdict.drift.from_history``): every case, every night."""

from __future__ import annotations

from typing import Any

from .history import History
from .history_rows import Point

# What a night's drift depends on, beyond the case: the host (its clock, its neighbours), the
# kind of device, and the protocol (windows of fewer steps spread more, launch to launch).
SAME = ("machine", "device_type", "protocol")


def machine_series(history: History, fingerprint: dict[str, Any], metric: str
                   ) -> list[list[Point]]:
    """Every series in ``history`` whose fingerprint agrees with ``fingerprint`` on ``SAME``,
    oldest night first, with ``metric``'s launches; those of one night are left out (they give
    no drift). Raises ``HistoryError`` where the store cannot be read."""
    found = []
    for key in history.keys():
        if key["runs"] < 2 or any(key["fingerprint"].get(name) != fingerprint.get(name)
                                  for name in SAME):
            continue
        points = history.series(key["case_key"], key["fingerprint_id"], metric)
        if len(points) > 1:
            found.append(points)
    return found


__all__ = ["SAME", "machine_series"]
