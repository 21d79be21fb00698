"""The port contract's ranks: for each port with a ``Ranks`` row in tests/ports.py, two ranks
train what one process trains on the same global batch (each compared run within the row's
bound of how far one process's parameters moved) and a wrong split is seen (beyond the row's
bound), whatever the launcher; then what the port's module checks of its ranks besides.

One job a port (tests/port_ranks.py's ``RanksJob``, from tests/port_<model>.py's
``ranks_jobs``), run once in this module whichever test asks first; a port whose interpreter
is missing skips, saying which setup script makes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import port_gpt
import port_insightface
import port_wide_deep
import psutil
import pytest
from port_ranks import RanksJob, Run, relative_diff
from ports import PORTS, Port, Ranks

JOBS: dict[str, RanksJob] = {**port_wide_deep.ranks_jobs(), **port_insightface.ranks_jobs(),
                             **port_gpt.ranks_jobs()}


def ported() -> list[tuple[Port, Ranks]]:
    return [(port, port.ranks) for port in PORTS if port.ranks is not None and port.id in JOBS]


def marks(ranks: Ranks) -> list[Any]:
    return [pytest.mark.outside_ci(ranks.outside_ci)] if ranks.outside_ci else []


SAME = [pytest.param(port, run, bound, id=f"{port.id}-{run}", marks=marks(ranks))
        for port, ranks in ported() for run, bound in ranks.same.items()]
WRONG = [pytest.param(port, *ranks.wrong, id=port.id, marks=marks(ranks))
         for port, ranks in ported() if ranks.wrong is not None]
CHECKS = [pytest.param(port, check, id=f"{port.id}-{check.__name__}", marks=marks(ranks))
          for port, ranks in ported() for check in JOBS[port.id].checks]


@pytest.fixture(scope="module")
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Any:
    """``trained(port)``: the port's runs, its job run the first time a test asks."""
    done: dict[str, Mapping[str, Run]] = {}

    def runs(port: Port) -> Mapping[str, Run]:
        if port.id not in done:
            job = JOBS[port.id]
            if job.needs:
                pytest.importorskip(job.needs, reason=f"{port.id}'s ranks need {job.needs} "
                                    "(scripts/setup installs it)")
            python = request.getfixturevalue(job.interpreter) if job.interpreter else None
            out: Path = tmp_path_factory.mktemp(port.id)
            before = {p.pid for p in psutil.Process().children(recursive=True)}
            done[port.id] = job.train(python, out)
            # A job leaves nothing behind in this process (multiprocessing's spawn context once
            # left its resource tracker, which a later test of the worker's children found).
            left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
            assert not left, f"{port.id}'s job left {[p.cmdline() for p in left]}"
        return done[port.id]

    return runs


def test_every_ranks_row_has_a_job_and_every_job_a_row() -> None:
    rows = {port.id for port in PORTS if port.ranks is not None
            and port.ranks.test.startswith("test_ports_ranks.py::")}
    assert rows == set(JOBS), "tests/ports.py's Ranks rows held here and the jobs differ"


@pytest.mark.parametrize("port, run, bound", SAME)
def test_two_ranks_train_what_one_process_trains(trained: Any, port: Port, run: str,
                                                 bound: float) -> None:
    job, runs = JOBS[port.id], trained(port)
    diff = relative_diff(runs[run], job.moved)
    print(f"{port.id} {run}: max |diff| / max move {diff:.3g}")
    assert diff < bound, f"{port.id} {run}: the parameters differ from one process's by {diff:.3g}"
    if job.run_check is not None:
        job.run_check(run, runs[run])


@pytest.mark.parametrize("port, run, bound", WRONG)
def test_a_wrong_split_is_seen(trained: Any, port: Port, run: str, bound: float) -> None:
    diff = relative_diff(trained(port)[run], JOBS[port.id].moved)
    assert diff > bound, f"{port.id} {run}: a wrong split moved the parameters by {diff:.3g} only"


@pytest.mark.parametrize("port, check", CHECKS)
def test_what_each_ports_ranks_hold(trained: Any, port: Port, check: Any) -> None:
    check(trained(port))
