"""The history's page reads a store as series: a case's runs in one fingerprint (``Series``,
``load``; each run's samples and phases), and the keys the page's Tables, Scaling lines and
Frameworks bars share: a row of the tables (``table_rows``), a test as the page names it
(``tests_of``) and the 1-device case a speedup is over (``single_of``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.phases import Phases
from ..store.baselines import THROUGHPUT
from ..store.history import History, Point
from ..verdict.changepoints import MAX_PVALUE, Step, steps

# The fingerprint's fields that make two cases one configuration on different topologies (for
# speedup).
_TOPOLOGY = ("nodes", "devices_per_node", "threads_per_worker")
RowKey = tuple[str, int, str, str, str]  # a row: model, devices, topology, configuration, test


@dataclass
class Series:
    case: str
    fingerprint_id: str
    fingerprint: dict[str, Any]
    framework: str
    model: str
    unit: str
    points: list[Point]
    steps: list[Step] = field(default_factory=list)

    @property
    def latest(self) -> Point:
        return self.points[-1]

    @property
    def phases(self) -> list[Phases | None]:
        """Each run's phases, oldest first; None for a run that ran no diagnostic steps."""
        return [Phases.from_json(p.phases) if p.phases else None for p in self.points]

    @property
    def devices(self) -> int:
        fp = self.fingerprint
        return int(fp.get("nodes", 1)) * int(fp.get("devices_per_node", 1))

    @property
    def topology(self) -> str:
        return f"{self.fingerprint.get('nodes', 1)}n{self.fingerprint.get('devices_per_node', 1)}d"

    @property
    def config(self) -> str:
        """Precision, per-device batch and compiler: what a DLPerf table row says."""
        fp = self.fingerprint
        text = f"{fp.get('precision', '?')}, batch {fp.get('batch_size', '?')}"
        if fp.get("compiler"):
            text += f", {fp['compiler']}"
        return text

    def key_without(self, fields: Sequence[str]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, repr(v)) for k, v in self.fingerprint.items() if k not in fields))


def load(history: History, max_pvalue: float = MAX_PVALUE) -> list[Series]:
    out = []
    for key in history.keys():
        points = history.series(key["case_key"], key["fingerprint_id"], THROUGHPUT)
        if not points:
            continue
        series = Series(key["case_key"], key["fingerprint_id"], key["fingerprint"],
                        key["framework"], key["model"], key["unit"], points)
        series.steps = steps(points, THROUGHPUT, f"{key['unit']}/s", True, max_pvalue)
        out.append(series)
    return out


def _row_config(s: Series) -> str:
    link = s.fingerprint.get("link")
    return s.config + (f", link {link}" if link else "")


def _function(case: str) -> str:
    """A case's test without its parameters (``file.py::test_x``): one test over topologies."""
    return case.partition("[")[0]


def tests_of(members: list[Series], by_function: bool = False) -> dict[str, str]:
    """Case -> its test as the page names it: the test's name in its file with its parameters
    (``test_x[1n2d-fp32]``, a table row), or without them ``by_function`` (a scaling line, over
    the topologies they name); the same in each framework's file so that their figures share a
    row; the whole key where files of one framework have tests of that name."""
    keys = {s.case: _function(s.case) if by_function else s.case for s in members}
    short = {case: key.partition("::")[2] or key for case, key in keys.items()}
    files: dict[tuple[str, str, str], set[str]] = {}
    for s in members:
        files.setdefault((s.model, s.framework, short[s.case]), set()).add(keys[s.case])
    return {s.case: keys[s.case] if len(files[(s.model, s.framework, short[s.case])]) > 1
            else short[s.case] for s in members}


def single_of(members: list[Series]) -> Callable[[Series], float | None]:
    """The newest median of a series' own 1n1d case: of its test (the same test function
    and fingerprint but for the topology), else the one other test's of that fingerprint (a
    scaling test whose 1n1d is the single-node test's); None where there is none, or several
    other tests' to choose from."""
    unlinked = (*_TOPOLOGY, "link")  # one device is every link's start
    own: dict[tuple[Any, ...], float] = {}
    shared: dict[tuple[Any, ...], list[float]] = {}
    for s in sorted((s for s in members if s.devices == 1), key=lambda s: s.latest.started_at):
        key = (s.model, s.framework, s.key_without(unlinked))
        own[(_function(s.case), key)] = s.latest.median
        shared.setdefault(key, []).append(s.latest.median)

    def single(s: Series) -> float | None:
        key = (s.model, s.framework, s.key_without(unlinked))
        found = own.get((_function(s.case), key))
        others = shared.get(key, [])
        return found if found is not None else others[0] if len(others) == 1 else None

    return single


def table_rows(all_series: list[Series]) -> dict[RowKey, dict[str, Series]]:
    """The tables' rows, (model, devices, topology, configuration, test) -> framework -> its
    series. Keyed by the configuration alone, one test's figure hid another's of a workload."""
    rows: dict[RowKey, dict[str, Series]] = {}
    tests = tests_of(all_series)
    for s in all_series:
        cells = rows.setdefault((s.model, s.devices, s.topology, _row_config(s), tests[s.case]), {})
        shown = cells.get(s.framework)  # one case's fingerprints: the newest run's
        if shown is None or shown.latest.started_at < s.latest.started_at:
            cells[s.framework] = s
    return rows
