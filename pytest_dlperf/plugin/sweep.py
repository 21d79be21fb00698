"""The sweep axis on the pytest side: a workload's size (a table's rows, a head's classes, the
batch) run as a case per rung, from ``--dlperf-sweep NAME=LADDER`` or the test's
``@pytest.mark.sweep(NAME=LADDER)``; what the rungs say together (each one's latency and peak
memory per device, the memory a unit of the size costs, the largest rung that fit); and the
first rung that runs out of memory, a result that ends the sweep, not an error.

A test takes the ``sweep`` fixture (a ``Sweep``) beside ``cluster``; ``measure`` runs the rung's
size. The rungs of one sweep share everything else (topology, layout, precision, compiler): its
key is the test's id without the rung."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from ..core.batchsearch import BATCH  # a sweep of the batch sets the per-device batch
from ..core.sweep import Fit, SweepError, fit, format_value, parse_ladder, rung_id
from ..core.units import format_bytes
from ..store.baseline_file import MEMORY
from ..verdict.record import CaseReport

MARKER = "sweep"


@dataclass(frozen=True)
class Rung:
    """One case of a sweep: the size's name, this case's value, and the whole ladder."""

    name: str
    value: int
    rungs: tuple[int, ...]

    @property
    def id(self) -> str:
        return rung_id(self.name, self.value)

    @property
    def shown(self) -> str:
        return f"{self.name}={format_value(self.value)}"


@dataclass
class Point:
    """A rung as it ended: measured (``report``), or out of memory (``oom``: the error's line)."""

    value: int
    report: CaseReport | None = None
    oom: str | None = None

    @property
    def latency_s(self) -> float | None:
        return None if self.report is None else self.report.result.step_s

    @property
    def peak_memory(self) -> float | None:
        """The largest rank's peak, the median over the launches (bytes); None: not measured."""
        if self.report is None or not self.report.result.memory_bytes:
            return None
        return float(self.report.metrics[MEMORY].median)


@dataclass
class SweepRecord:
    """Every rung of one sweep this session ran, in the order it ran them."""

    key: str
    name: str
    rungs: tuple[int, ...]
    points: list[Point] = field(default_factory=list)

    @property
    def measured(self) -> list[Point]:
        return sorted((p for p in self.points if p.report is not None), key=lambda p: p.value)

    @property
    def out_of_memory(self) -> Point | None:
        """The smallest rung that ran out of memory."""
        return min((p for p in self.points if p.oom is not None), key=lambda p: p.value,
                   default=None)

    @property
    def largest_fit(self) -> int | None:
        measured = self.measured
        return measured[-1].value if measured else None

    def memory_fit(self) -> Fit | None:
        """Peak memory per device against the size, a line over the measured rungs: its slope
        is what one unit (a row) costs a device."""
        return fit([(p.value, p.peak_memory) for p in self.measured
                    if p.peak_memory is not None])

    def to_json(self) -> dict[str, Any]:
        memory = self.memory_fit()
        oom = self.out_of_memory
        return {"case": self.key, "size": self.name, "rungs": list(self.rungs),
                "points": [{"value": p.value, "outcome": "out-of-memory" if p.oom else "measured",
                            "message": p.oom,
                            "samples_per_s": p.report.result.median if p.report else None,
                            "latency_ms": 1e3 * p.latency_s if p.latency_s else None,
                            "peak_memory_bytes": p.peak_memory}
                           for p in sorted(self.points, key=lambda p: p.value)],
                "largest_fit": self.largest_fit,
                "out_of_memory_at": oom.value if oom else None,
                "memory_per_unit_bytes": memory.per_unit if memory else None,
                "memory_intercept_bytes": memory.intercept if memory else None,
                "memory_fit_r2": memory.r2 if memory else None}


class Sweep:
    """What the ``sweep`` fixture hands a test: its rung, and the sweep's rungs measured so far
    in this session (this one's too, once ``measure`` returned), to assert on."""

    def __init__(self, rung: Rung, record: SweepRecord) -> None:
        self.rung, self.record = rung, record

    @property
    def name(self) -> str:
        return self.rung.name

    @property
    def value(self) -> int:
        return self.rung.value

    @property
    def rungs(self) -> tuple[int, ...]:
        return self.rung.rungs

    @property
    def is_last(self) -> bool:
        return self.rung.value == self.rung.rungs[-1]

    @property
    def points(self) -> list[Point]:
        """The measured rungs, smallest first."""
        return self.record.measured

    def memory_fit(self) -> Fit | None:
        return self.record.memory_fit()

    def __repr__(self) -> str:
        return f"Sweep({self.rung.shown} of {', '.join(map(format_value, self.rungs))})"


def ladder(definition: Any, option: Mapping[str, tuple[int, ...]], device_type: str
           ) -> tuple[str, tuple[int, ...]]:
    """The size a test that takes ``sweep`` sweeps and its rungs: ``--dlperf-sweep`` for the
    marker's size, else the marker's rungs (per device type where it maps them, as workloads'
    sizes do: ``{"cpu": "200k..3.2M:x2", "cuda": "3.2M..51.2M:x2"}``); with no marker, the one
    size ``--dlperf-sweep`` names. A usage error naming the test otherwise."""
    nodeid = definition.nodeid
    marker = definition.get_closest_marker(MARKER)
    if marker is None:
        if len(option) == 1:
            return next(iter(option.items()))
        raise pytest.UsageError(
            f"pytest-dlperf: {nodeid} takes the sweep fixture but names no size to sweep: mark "
            "it @pytest.mark.sweep(vocab=\"200k..3.2M:x2\") (a size of its workload and its "
            "rungs), or give --dlperf-sweep NAME=LADDER"
            + (f" (given for {', '.join(option)}: name one)" if option else ""))
    if marker.args or len(marker.kwargs) != 1:
        raise pytest.UsageError(
            f"pytest-dlperf: {nodeid}: @pytest.mark.sweep(...) takes one size as a keyword, its "
            f"rungs as a ladder or a list: @pytest.mark.sweep(vocab=\"200k..3.2M:x2\") or "
            f"@pytest.mark.sweep(vocab=[200_000, 400_000]); got args={marker.args!r} "
            f"kwargs={marker.kwargs!r}")
    ((name, raw),) = marker.kwargs.items()
    if name in option:
        return name, option[name]
    if isinstance(raw, Mapping):
        if device_type not in raw:
            raise pytest.UsageError(
                f"pytest-dlperf: {nodeid}: @pytest.mark.sweep({name}=...) gives rungs for "
                f"{', '.join(map(str, raw))}, not for {device_type}: add a {device_type!r} "
                f"entry, or give --dlperf-sweep {name}=LADDER")
        raw = raw[device_type]
    try:
        return name, parse_ladder(raw)
    except SweepError as exc:
        raise pytest.UsageError(f"pytest-dlperf: {nodeid}: @pytest.mark.sweep({name}=...): "
                                f"{exc}") from None


def key_of(node: pytest.Item, rung: Rung) -> str:
    """The sweep's key: the test's id without its rung (``test_w[1n1d-fp32]``)."""
    callspec = getattr(node, "callspec", None)
    base = node.nodeid.partition("[")[0]
    parts = [p for p in (callspec.id if callspec else "").split("-") if p != rung.id]
    return f"{base}[{'-'.join(parts)}]" if parts else base


def rung_of(node: pytest.Item) -> Rung | None:
    """The rung this test runs (its ``sweep`` fixture's), or None: not a sweep."""
    given = getattr(node, "funcargs", {}).get("sweep")
    return given.rung if isinstance(given, Sweep) else None


def skip_past(record: SweepRecord, rung: Rung) -> None:
    """Skip a rung above one that ran out of memory this session: the sweep stopped there."""
    oom = record.out_of_memory
    if oom is not None and rung.value > oom.value:
        largest = record.largest_fit
        pytest.skip(f"{rung.shown}: {rung.name}={format_value(oom.value)} ran out of memory "
                    f"(a sweep stops at the first rung that does); the largest that fit: "
                    f"{format_value(largest) if largest else 'none'}")


def summary_lines(records: list[SweepRecord], unit: str = "samples") -> list[str]:
    """Each sweep's table (rung, throughput, latency, peak memory per device), then what a unit
    of the size costs and the largest rung that fit."""
    lines: list[str] = []
    for record in records:
        if not record.points:
            continue
        lines.append(f"{record.key}: {record.name} over {len(record.points)} of "
                     f"{len(record.rungs)} rung(s)")
        header = [record.name, f"throughput ({unit}/s)", "latency/iter", "peak mem/device"]
        rows = []
        for point in sorted(record.points, key=lambda p: p.value):
            if point.report is None:
                rows.append([format_value(point.value), "OOM", "-", "OOM"])
                continue
            result = point.report.result
            rows.append([format_value(point.value), f"{result.median:,.1f}",
                         f"{1e3 * result.step_s:,.2f} ms", format_bytes(point.peak_memory)])
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)))
        memory = record.memory_fit()
        if memory is not None:
            r2 = "" if memory.r2 is None else f", r2 {memory.r2:.3f}"
            per = (format_bytes(memory.per_unit) if abs(memory.per_unit) >= 1024
                   else f"{memory.per_unit:,.1f} B")
            lines.append(f"  memory per {record.name} unit: {per} a device (a line over "
                         f"{memory.points} rungs: {format_bytes(memory.intercept)} + {per} x "
                         f"{record.name}{r2})")
        oom = record.out_of_memory
        largest = record.largest_fit
        if oom is not None:
            lines.append(f"  largest that fit: {format_value(largest) if largest else 'none'}; "
                         f"{format_value(oom.value)} ran out of memory: {oom.oom}")
        elif largest is not None:
            lines.append(f"  largest that fit: {format_value(largest)} (every rung run fit)")
    return lines


def parametrize(metafunc: pytest.Metafunc, option: Mapping[str, tuple[int, ...]] | None,
                batch_given: bool, sizes_given: Mapping[str, object] | None,
                device_type: str) -> None:
    """A test that takes ``sweep``: a case per rung, its id the rung's (``vocab200k``)."""
    name, rungs = ladder(metafunc.definition, option or {}, device_type)
    if name == BATCH and batch_given:
        raise pytest.UsageError(
            f"pytest-dlperf: {metafunc.definition.nodeid} sweeps batch_size, and "
            "--dlperf-batch-size sets every case's batch: give one of them")
    if name in (sizes_given or {}):
        raise pytest.UsageError(
            f"pytest-dlperf: {metafunc.definition.nodeid} sweeps {name}, and --dlperf-size "
            f"sets every case's {name}: give one of them")
    values = [Rung(name, value, rungs) for value in rungs]
    metafunc.parametrize("sweep", values, ids=[r.id for r in values], indirect=True)


def unswept(items: list[pytest.Item], option: Mapping[str, tuple[int, ...]] | None) -> None:
    """A usage error for a ``--dlperf-sweep`` size no collected test sweeps."""
    if not option:
        return
    swept = {rung.name for item in items
             if isinstance(rung := getattr(getattr(item, "callspec", None), "params", {})
                           .get("sweep"), Rung)}
    missing = sorted(set(option) - swept)
    if missing:
        raise pytest.UsageError(
            f"pytest-dlperf: --dlperf-sweep {', '.join(missing)}: no collected test sweeps "
            f"{'it' if len(missing) == 1 else 'them'} (tests sweep: "
            f"{', '.join(sorted(swept)) or 'nothing'}); a test sweeps a size of its workload "
            "by taking the sweep fixture, with @pytest.mark.sweep(NAME=LADDER)")


def fixture_value(request: pytest.FixtureRequest, records: dict[str, SweepRecord]) -> Sweep:
    """The ``sweep`` fixture's value: the rung, and its sweep's record in this session."""
    rung = getattr(request, "param", None)
    if not isinstance(rung, Rung):
        raise pytest.UsageError(f"pytest-dlperf: {request.node.nodeid}: the sweep fixture is "
                                "parametrized by the plugin; a test's own parametrize of "
                                "'sweep' is not a sweep")
    key = key_of(request.node, rung)
    record = records.setdefault(key, SweepRecord(key, rung.name, rung.rungs))
    return Sweep(rung, record)


def write_summary(terminal: Any, records: list[SweepRecord],
                  sizes: Mapping[str, object] | None, used: set[str] | None) -> None:
    """The sweeps' tables, and a word on a --dlperf-size no case's workload had (``used``: the
    sizes the session's cases took; None: no case ran)."""
    unused = sorted(set(sizes or {}) - used) if used is not None else []
    if unused:
        terminal.write_line(f"pytest-dlperf: --dlperf-size {', '.join(unused)}: no case's "
                            f"workload has {'that size' if len(unused) == 1 else 'those sizes'}; "
                            "nothing was changed", yellow=True)
    if any(record.points for record in records):
        terminal.write_sep("-", "pytest-dlperf: sweeps (each rung's median; latency of one "
                                "iteration; peak memory of the largest rank)")
        for line in summary_lines(records):
            terminal.write_line(line)
