"""The port contract's ranks (tests/ports.py's ``Ranks`` rows, run by tests/test_ports_ranks.py):
each port's job of two ranks, read into one form, ``Run``, whatever its launcher wrote, so that
one test holds every port to "two ranks train what one process trains on the same global batch,
and a wrong split is seen", by the table's bounds.

A job is its launcher's (torchrun; OneFlow's own; MXNet's store, every rank at once; two gloo or
JAX processes started together), its runs and its rank script as each port's module names them
(tests/port_<model>.py's ``ranks_jobs``); what else a
port's ranks hold (a rank's shards, the classes Partial FC kept) is checked by that module's
functions, listed in ``RanksJob.checks``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from snippets import REPO, free_ports, oneflow_launch_runs, run_together, torchrun_runs

Arrays = dict[str, np.ndarray]


@dataclass
class Run:
    """One run of a job: each rank's whole model after its steps (``params``: one where rank 0
    gathered the ranks' shards), one process's on the run's global batch (``reference``) and
    where it began (``start``), and what each rank wrote besides (``ranks``: its environment,
    losses, ...; ``error`` where the run was refused)."""

    params: list[Arrays]
    reference: Arrays
    start: Arrays
    ranks: list[dict[str, Any]]
    whole: dict[str, Any] = field(default_factory=dict)  # what one process wrote besides


def relative_diff(run: Run, moved_at_least: float = 0.0) -> float:
    """The largest difference of any rank's parameters from one process's, over the largest
    distance any parameter moved in one process's steps (which must exceed
    ``moved_at_least``: a comparison worth making)."""
    reference, start = run.reference, run.start
    moved = max(float(np.abs(reference[n] - start[n]).max()) for n in reference)
    assert moved > moved_at_least, f"one process's parameters moved {moved:.3g} only"
    diffs = []
    for rank, params in zip(run.ranks, run.params):
        assert "error" not in rank, rank["error"]
        assert sorted(params) == sorted(reference)  # every parameter, whole
        diffs.append(max(float(np.abs(params[n] - reference[n]).max()) for n in reference))
    return max(diffs) / moved


@dataclass(frozen=True)
class RanksJob:
    """How a port's ranks train (``train(python, out)``: its runs by name, read into ``Run``),
    under which interpreter (``interpreter``: a fixture's name, None for pytest's), with what
    each compared run must also show (``run_check(name, run)``), the least distance one
    process's parameters must move (``moved``), its module's other checks of the ranks, and a
    module it needs in pytest's interpreter (``needs``: the test skips without it)."""

    train: Callable[[str | None, Path], Mapping[str, Run]]
    interpreter: str | None = None
    run_check: Callable[[str, Run], None] | None = None
    moved: float = 0.0
    checks: tuple[Callable[[Mapping[str, Run]], None], ...] = ()
    needs: str | None = None  # a module the job's ranks import, which may not be installed


def approx(expected: Any, rel: float) -> Any:
    """pytest's approx, for the ports' checks (their modules are also imported by ranks under
    interpreters without pytest)."""
    import pytest

    return pytest.approx(expected, rel=rel)


# -- readers, one per launcher's way of writing its results -----------------------------------

def numpy_of(tensors: Mapping[str, Any]) -> Arrays:
    return {name: t.detach().cpu().numpy() for name, t in tensors.items()}


def torchrun_job(script: str, runs: dict[str, tuple[object, int, dict[str, Any]]],
                 reference_name: Callable[[dict[str, Any]], str]) -> Callable[..., dict[str, Run]]:
    """A torchrun job of two processes (``snippets.torchrun_runs``): rank 0 saves each run's
    whole model (gathered) as ``<name>.pt`` beside what it holds, and one process's reference,
    ``reference_name(run)``."""

    def train(python: str | None, out: Path) -> dict[str, Run]:
        import torch

        read: dict[str, Run] = {}
        for given in torchrun_runs(script, out, runs):
            result = torch.load(out / f"{given['name']}.pt", weights_only=False)
            reference = torch.load(out / reference_name(given), weights_only=False)
            read[given["name"]] = Run(
                [numpy_of(result.pop("params"))], numpy_of(reference.pop("params")),
                numpy_of(reference.pop("start")), [result], reference)
        return read

    return train


def oneflow_job(script: str, runs: dict[str, tuple[object, str, dict[str, Any]]],
                what: str) -> Callable[..., dict[str, Run]]:
    """A job of two OneFlow ranks (``snippets.oneflow_launch_runs``): each rank writes its
    whole model (``<name>-<rank>.npz``, global tensors made whole) and what it holds
    (``.json``); rank 0 one process's (``reference.npz``, ``start.npz``, ``reference.json``)."""

    def train(python: str | None, out: Path) -> dict[str, Run]:
        assert python is not None
        oneflow_launch_runs(python, script, out, runs, what)
        reference, start = dict(np.load(out / "reference.npz")), dict(np.load(out / "start.npz"))
        whole = json.loads((out / "reference.json").read_text()) \
            if (out / "reference.json").exists() else {}
        read = {}
        for name in runs:
            ranks = [json.loads((out / f"{name}-{rank}.json").read_text()) for rank in (0, 1)]
            read[name] = Run([dict(np.load(out / f"{name}-{rank}.npz")) for rank in (0, 1)],
                             reference, start, ranks, whole)
        return read

    return train


def mxnet_job(script: str, jobs: tuple[dict[str, tuple[str, int, dict[str, Any]]], ...],
              whole: str, joined: tuple[str, ...]) -> Callable[..., dict[str, Run]]:
    """MXNet ranks (its store, ``dist_sync``), every rank of a job's runs at once, each run a
    store of its own; ``jobs`` one after the other (as many processes at once as the machine
    bears). Each rank writes its model (``<name>-<rank>.npz``), where it began and what it holds;
    run ``whole`` is one process's on the global batch, the reference of every other run. A
    parameter in ``joined`` is split by rows over the ranks: each rank's model has it whole,
    joined from the ranks' rows."""

    def train(python: str | None, out: Path) -> dict[str, Run]:
        assert python is not None
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "GLOG_minloglevel": "2", "MASTER_ADDR": "127.0.0.1"}
        written: dict[str, list[dict[str, Any]]] = {}
        for runs in jobs:
            codes = []
            for (name, (layout, world, options)), port in zip(runs.items(),
                                                               free_ports(len(runs))):
                for rank in range(world):
                    argv = ["rank", str(out), name, layout, str(rank), str(world),
                            json.dumps(options)]
                    codes.append(f"import os, runpy, sys; os.environ['DLPERF_FRAMEWORK_PORT'] = "
                                 f"'{port}'; sys.argv = {argv!r}; runpy.run_path("
                                 f"'tests/{script}', run_name='__main__')")
            run_together(python, codes, env)
            for name, (_, world, _) in runs.items():
                written[name] = [{**json.loads((out / f"{name}-{rank}.json").read_text()),
                                  "params": dict(np.load(out / f"{name}-{rank}.npz")),
                                  "start": dict(np.load(out / f"{name}-{rank}-start.npz"))}
                                 for rank in range(world)]
        (one,) = written.pop(whole)
        reference, start = one.pop("params"), one.pop("start")
        read = {}
        for name, ranks in written.items():
            params = [rank.pop("params") for rank in ranks]
            for rank in ranks:
                rank.pop("start")
            rows = {n: np.concatenate([p[n] for p in params]) for n in joined}
            read[name] = Run([{**p, **rows} for p in params], reference, start, ranks, one)
        return read

    return train
