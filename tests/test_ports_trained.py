"""The port contract (tests/ports.py), trained: each port's recipe through its framework's
adapter (the trainer a case builds: its optimizer, clip and compiler) on one process, a job
per framework (tests/port_job.py's ``recipe``), the ports kept out of CI in a job of their
own. What a port's hand-written loop checks of the model's internals stays in its own file."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ports import PORTS, Port
from snippets import run_snippet

JOB = Path(__file__).with_name("port_job.py")


def trained_ports() -> list[Port]:
    return [port for port in PORTS if port.trains is not None
            and port.trains.test.startswith("test_ports_trained.py::")]


def cases() -> list[Any]:
    """One param a port, id ``<model>-<framework>``; the row's ``outside_ci`` its mark."""
    return [pytest.param(port, id=port.id, marks=[pytest.mark.outside_ci(why)]
                         if (why := port.trains.outside_ci) else [])
            for port in trained_ports() if port.trains is not None]


@pytest.fixture(scope="module")
def recipes(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Port], dict[str, Any]]:
    """Each framework's recipe job, once for the ports it trains in CI and once for those it
    trains outside CI (so that CI's job never runs what it leaves out)."""
    done: dict[tuple[str, bool], dict[str, Any]] = {}

    def losses(port: Port) -> dict[str, Any]:
        assert port.trains is not None
        key = (port.framework, port.trains.outside_ci is None)
        if key not in done:
            python = port.record().python()
            ports = {p.model: {"workload": p.trains.workload, "batch": p.trains.batch,
                               "sizes": dict(p.trains.sizes), "compilers": p.trains.compilers,
                               "steps": p.trains.steps}
                     for p in trained_ports() if p.trains is not None
                     and (p.framework, p.trains.outside_ci is None) == key}
            spec = {"framework": port.framework, "job": "recipe", "ports": ports}
            folder = tmp_path_factory.mktemp(f"{port.framework}-recipe")
            code = (f"import os, runpy, sys; os.chdir({str(folder)!r}); "
                    f"sys.argv[1:] = [{json.dumps(spec)!r}]; "
                    f"runpy.run_path({str(JOB)!r}, run_name='__main__')")
            done[key] = run_snippet(python, code)
        found = done[key][port.model]
        assert "error" not in found, found["error"]
        return found

    return losses


@pytest.mark.parametrize("port", cases())
def test_the_recipe_trains_through_the_adapter(recipes: Any, port: Port) -> None:
    """Each compiler's steps on fresh batches: finite losses where an untrained model's
    are (the row's first, every and band), the parameters the workload counts, and where the
    row says so, distinct losses, Paddle's one static program (no fallback to eager) and the
    compiled step's first loss the eager one's (the same seed: the same weights, batch and
    dropout masks)."""
    row = port.trains
    assert row is not None
    out = dict(recipes(port))
    if row.programs is not None:
        assert out.pop("programs") == row.programs  # no fallback to eager (full_graph=True)
    assert sorted(out) == sorted(row.compilers)
    for mode, run in out.items():
        losses = run["losses"]
        assert all(math.isfinite(loss) for loss in losses), (mode, losses)
        if row.first is not None:
            expected, within = row.first
            assert abs(losses[0] - expected) < within, (mode, losses)
        if row.every is not None:
            expected, within = row.every
            assert all(abs(loss - expected) < within for loss in losses), (mode, losses)
        if row.band is not None:
            low, high = row.band
            assert all(low < loss < high for loss in losses), (mode, losses)
        if row.distinct:
            assert len(set(losses)) == len(losses), (mode, losses)  # a fresh batch every step
        if row.parameters is not None:
            assert run["parameters"] == row.parameters
        if row.more_than is not None:
            assert run["parameters"] > row.more_than  # the head and a backbone
    if row.same_first is not None:
        assert out["compiled"]["losses"][0] == pytest.approx(out["eager"]["losses"][0],
                                                             rel=row.same_first)
