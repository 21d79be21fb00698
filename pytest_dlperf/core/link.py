"""A node's link in local mode (``--dlperf-link``): a rate and, where the kernel can add one, a
delay. Parsed here (standard library only); ``launch.fabric`` shapes the links with it."""

from __future__ import annotations

import re
from dataclasses import dataclass

# How much of a second's rate one TBF burst may send at once: a 32 kbit burst reached only ~60%
# of 1 Gbit/s here, 1 ms of the rate (1 Mbit) 93%.
_BURST_S = 0.001
_MIN_BURST_BYTES = 16 * 1024

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)?\s*$", re.IGNORECASE)
_DELAY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s)\s*$", re.IGNORECASE)
_RATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_DELAY_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass(frozen=True)
class Link:
    """Each node's link to the bridge: a rate in bit/s (None: unshaped) and a one-way delay in
    ms (None: none added)."""

    rate_bps: float | None = None
    delay_ms: float | None = None

    @classmethod
    def parse(cls, raw: str) -> Link:
        """``unshaped``, ``RATE`` or ``RATE,DELAY``: ``10gbit``, ``1gbit,0.2ms``, ``100mbit``
        (bits per second; ``bps`` means bytes per second, as in tc)."""
        text = raw.strip().lower()
        if text in ("", "unshaped", "none"):
            return cls()
        rate_text, _, delay_text = text.partition(",")
        match = _RATE.match(rate_text)
        if (not match or float(match.group(1)) <= 0
                or not (match.group(2) or match.group(3))):
            raise ValueError(f"{raw!r}: the rate must be a positive number of bits per second "
                             "with a unit, e.g. 10gbit, 1gbit, 100mbit (or 'unshaped')")
        number, unit, kind = float(match.group(1)), match.group(2).lower(), (match.group(3) or "bit")
        rate = number * _RATE_UNITS[unit] * (8 if kind.lower() == "bps" else 1)
        delay = None
        if delay_text:
            found = _DELAY.match(delay_text)
            if not found:
                raise ValueError(f"{raw!r}: the delay after the comma must be a time with a unit, "
                                 "e.g. 0.2ms, 50us, 1ms")
            delay = float(found.group(1)) * _DELAY_UNITS[found.group(2).lower()]
        return cls(rate, delay)

    @property
    def shaped(self) -> bool:
        return self.rate_bps is not None or self.delay_ms is not None

    def __str__(self) -> str:
        if not self.shaped:
            return "unshaped"
        parts = [_rate_text(self.rate_bps) if self.rate_bps is not None else "unlimited"]
        if self.delay_ms is not None:
            parts.append(f"{self.delay_ms:g}ms")
        return ",".join(parts)

    def burst_bytes(self) -> int:
        assert self.rate_bps is not None
        return max(_MIN_BURST_BYTES, int(self.rate_bps / 8 * _BURST_S))


def _rate_text(bps: float) -> str:
    for unit, scale in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def format_rate(bps: float) -> str:
    """8.1e9 -> '8.1 Gbit/s'."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"
