"""The history page's phases of a case, run by run: a bar per run of the seconds per step of
each phase of its diagnostic steps (``core.phases``), stacked in the order the step runs them, at
the run's place on the case's trend above it (the same runs, the same dates), so a step in the
trend lines up with the phase that grew."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.phases import BACKWARD, DATA, EXPOSED, FORWARD, OPTIMIZER, REST, Phases
from ..store.history import Point

# One colour per standard phase on every case's plot, so that a reader compares like with like
# between cases; other phases (an adapter's merged ones) take the colours left.
COLOURS = {DATA: "#8e44ad", FORWARD: "#2980b9", BACKWARD: "#27ae60", OPTIMIZER: "#f39c12",
           REST: "#bdc3c7", EXPOSED: "#c0392b"}
OTHER_COLOURS = ("#16a085", "#d35400", "#2c3e50", "#7f8c8d", "#e84393", "#6c5ce7")


def phase_order(runs: Sequence[Phases | None]) -> list[str]:
    """Every phase any run has, in step order: a run's new phase goes in after the phase that
    precedes it in that run (runs may cut their steps differently: an adapter that merged
    forward and backward, a run that measured no exposed communication)."""
    merged: list[str] = []
    for phases in runs:
        if phases is None:
            continue
        before = -1
        for name in phases.order:
            if name in merged:
                before = merged.index(name)
            else:
                before += 1
                merged.insert(before, name)
    return merged


def stacks(runs: Sequence[Phases | None]) -> dict[str, list[float]]:
    """Phase -> its seconds per step in each run, in ``phase_order``; 0 where a run has not
    got it (no bar: a run without phases)."""
    return {name: [p.seconds.get(name, 0.0) if p is not None else 0.0 for p in runs]
            for name in phase_order(runs)}


def run_axis(ax: Any, points: Sequence[Point]) -> None:
    """The runs along x as the trend draws them: 1 to n, labelled by date."""
    xs = list(range(1, len(points) + 1))
    ticks = xs if len(xs) <= 12 else xs[:: max(1, len(xs) // 10)]
    ax.set_xticks(ticks)
    span = points[-1].started_at - points[0].started_at
    fmt = "%m-%d" if span > dt.timedelta(days=3) else "%m-%d\n%H:%M"
    ax.set_xticklabels([points[i - 1].started_at.strftime(fmt) for i in ticks])
    ax.set_xlabel("run (date)")
    ax.set_xlim(0.5, len(xs) + 0.5)


def phase_plot(plt: Any, points: Sequence[Point], runs: Sequence[Phases | None],
               path: Path) -> bool:
    """The stacked bars of ``runs`` (one per point) into ``path``; False, and nothing
    written, where no run has phases."""
    bars = stacks(runs)
    if not bars:
        return False
    tallest = max(sum(column) for column in zip(*bars.values()))
    scale, unit = (1e3, "ms") if tallest < 1 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(8, 2.8))
    xs = list(range(1, len(points) + 1))
    bottom = [0.0] * len(xs)
    others = iter(OTHER_COLOURS * (1 + len(bars) // len(OTHER_COLOURS)))
    for name, seconds in bars.items():
        heights = [s * scale for s in seconds]
        ax.bar(xs, heights, 0.7, bottom=bottom, label=name,
               color=COLOURS.get(name) or next(others))
        bottom = [b + h for b, h in zip(bottom, heights)]
    run_axis(ax, points)
    ax.set_ylabel(f"{unit} per step")
    handles, labels = ax.get_legend_handles_labels()  # top down, as the bars stack
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
