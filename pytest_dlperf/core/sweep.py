"""A size swept as a case axis: its ladder as people write it (``200k..3.2M:x2``, ``512,1024``),
each rung's spelling in a case id (``vocab3.2M``), and what a sweep's rungs say together: the
memory one unit of the size costs, fitted over the rungs that fit.

Counts (rows, classes, tokens) are decimal: ``k`` is 1,000, ``M`` 1,000,000, ``G`` 10^9 (memory
sizes elsewhere are binary: ``2G`` of ``--dlperf-memory-limit`` is 2 GiB). Standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

# The most rungs one sweep may have: each is a case of its own (launches, a baseline).
MAX_RUNGS = 32
SUFFIXES = (("G", 10 ** 9), ("M", 10 ** 6), ("k", 10 ** 3))
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SweepError(ValueError):
    """A ladder or a value that cannot be read; the message says what is accepted."""


def parse_value(raw: object) -> int:
    """A positive count from ``200k``, ``3.2M``, ``1G``, ``2_322_444`` or an int."""
    if isinstance(raw, bool) or isinstance(raw, float) and not raw.is_integer():
        raise SweepError(f"expected a positive whole count such as 200k, 3.2M or 16, got {raw!r}")
    if isinstance(raw, (int, float)):
        value = int(raw)
    else:
        text = str(raw).strip().replace("_", "")
        scale = next((size for suffix, size in SUFFIXES
                      if text.endswith(suffix) or suffix == "k" and text.endswith("K")), 1)
        number = text[:-1] if scale != 1 else text
        try:
            exact = float(number) * scale
        except ValueError:
            raise SweepError(f"expected a count such as 200k, 3.2M, 1G or 16, got {raw!r}") from None
        if not math.isfinite(exact) or not exact.is_integer():
            raise SweepError(f"{raw!r} is not a whole count")
        value = int(exact)
    if value < 1:
        raise SweepError(f"expected a count of at least 1, got {raw!r}")
    return value


def format_value(value: int) -> str:
    """A count as a case id spells it: ``200k``, ``3.2M``, ``819.2M``, ``16``; digits where no
    suffix with up to two decimals says it exactly (``2322444``, ``1234``)."""
    for suffix, size in SUFFIXES:
        if value >= size:
            for decimals in range(3):
                text = f"{value / size:.{decimals}f}"
                if round(float(text) * size) == value:
                    return text + suffix
    return str(value)


def parse_ladder(raw: object) -> tuple[int, ...]:
    """The rungs, ascending: ``200k..3.2M:x2`` (each the last times 2, up to the top),
    ``512..2048:+512`` (plus 512), ``200k,400k,1M`` (as listed), or a sequence of counts."""
    if isinstance(raw, (list, tuple)):
        rungs = tuple(parse_value(v) for v in raw)
    else:
        text = str(raw).strip()
        span, _, step = text.partition(":")
        ends = span.split("..")
        if len(ends) == 2 and step[:1] in ("x", "+") and len(step) > 1:
            rungs = _stepped(text, ends[0], ends[1], step[0], step[1:])
        elif ".." in text or ":" in text:
            raise SweepError(f"{text!r}: a ladder reads LOW..HIGH:xFACTOR (200k..3.2M:x2) or "
                             "LOW..HIGH:+STEP (512..2048:+512)")
        else:
            rungs = tuple(parse_value(v) for v in text.split(",") if v.strip())
    if not rungs:
        raise SweepError("the ladder has no rungs: give counts such as 200k,400k or a ladder "
                         "such as 200k..3.2M:x2")
    if any(b <= a for a, b in zip(rungs, rungs[1:])):
        raise SweepError(f"the rungs must rise, each larger than the last, got "
                         f"{', '.join(map(format_value, rungs))}")
    if len(rungs) > MAX_RUNGS:
        raise SweepError(f"{len(rungs)} rungs: at most {MAX_RUNGS} (each is a case of its own)")
    return rungs


def _stepped(text: str, low_raw: str, high_raw: str, how: str, step_raw: str
             ) -> tuple[int, ...]:
    low, high = parse_value(low_raw), parse_value(high_raw)
    if high < low:
        raise SweepError(f"{text!r}: the top ({high_raw}) is below the bottom ({low_raw})")
    rungs = [low]
    if how == "x":
        try:
            factor = float(step_raw)
        except ValueError:
            raise SweepError(f"{text!r}: the factor after :x must be a number > 1") from None
        if not factor > 1:
            raise SweepError(f"{text!r}: the factor after :x must be > 1, got {step_raw}")
        while (following := round(rungs[-1] * factor)) <= high and len(rungs) <= MAX_RUNGS:
            rungs.append(max(following, rungs[-1] + 1))
    else:
        step = parse_value(step_raw)
        while rungs[-1] + step <= high and len(rungs) <= MAX_RUNGS:
            rungs.append(rungs[-1] + step)
    return tuple(rungs)


def parse_option(raw: str) -> tuple[str, tuple[int, ...]]:
    """``--dlperf-sweep NAME=LADDER``: the size's name and its rungs."""
    name, sep, ladder = str(raw).partition("=")
    name = name.strip()
    if not sep or not _NAME.fullmatch(name):
        raise SweepError(f"expected NAME=LADDER, a workload's size and its rungs (vocab=200k.."
                         f"3.2M:x2, num_classes=100k,1M), got {raw!r}")
    return name, parse_ladder(ladder)


def parse_options(raw: str) -> dict[str, tuple[int, ...]]:
    """``--dlperf-sweep``'s value: one or more ``NAME=LADDER``, given as separate flags (pytest
    joins them with commas) or in one, each size at most once."""
    items: list[str] = []
    for token in str(raw).split(","):
        if "=" in token or not items:
            items.append(token)
        else:  # a list's next rung: vocab=200k,400k
            items[-1] += "," + token
    sweeps: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, rungs = parse_option(item)
        if name in sweeps:
            raise SweepError(f"{name} is swept twice; give its rungs once")
        sweeps[name] = rungs
    return sweeps


def rung_id(name: str, value: int) -> str:
    """A rung's part of a case id: ``vocab3.2M`` (no ``=``: ``-k`` could not select it)."""
    return f"{name}{format_value(value)}"


@dataclass(frozen=True)
class Fit:
    """A straight line through (size, bytes) points: ``per_unit`` bytes for each unit of the
    size (a table's row), over ``intercept`` bytes of everything else; ``points`` fitted."""

    per_unit: float
    intercept: float
    points: int
    r2: float | None  # None where all points lie on the line by construction (two points)

    def at(self, value: float) -> float:
        return self.intercept + self.per_unit * value


def fit(points: Sequence[tuple[float, float]]) -> Fit | None:
    """The least-squares line through ``points``; None for fewer than two distinct sizes."""
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    if len(set(xs)) < 2:
        return None
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    r2 = None
    if n > 2:
        total = sum((y - mean_y) ** 2 for y in ys)
        residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
        r2 = 1.0 - residual / total if total > 0 else 1.0
    return Fit(slope, intercept, n, r2)
