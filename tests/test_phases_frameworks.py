"""Phases (issue 41) in the TensorFlow, OneFlow and Paddle adapters: real ranks of each train a
small MLP, then run the diagnostic steps as a rank does after its timed windows
(``tests/phases_frameworks_mlp_rank.py``); their JSON is what ``core.phases`` pools.

What each adapter reports: TensorFlow one phase, its whole ``tf.function`` step (the batch read
inside it), in either mode; OneFlow data, forward, backward, optimizer eagerly and data then one
nn.Graph compiled; Paddle the four in both modes (``to_static`` compiles the forward only).
Gradient communication is switched off on two ranks where the framework lets it be (OneFlow's
eager DDP, Paddle's DataParallel, TensorFlow's own all-reduce), not in OneFlow's nn.Graph.

Each rank trains on a batch of its own, so the switch shows in the weights: apart after the
steps without communication, the same to the bit where every step all-reduced. Measured here
(2 cores, MLP 16-32-32-4, 2 ranks, backward with / without communication): OneFlow eager
0.94 / 0.45 ms, Paddle 4.2 / 0.18 ms; each job 1 to 12 s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from snippets import REPO, free_ports

from pytest_dlperf.core.phases import (
    BACKWARD,
    DATA,
    EXPOSED,
    FORWARD,
    OPTIMIZER,
    REST,
    PhaseSamples,
    merged,
)

STEPS = 3
GRADIENT_BYTES = 4 * (16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4)  # the MLP's float32 weights
FOUR = [DATA, FORWARD, BACKWARD, OPTIMIZER]
EXPECTED = {
    ("tensorflow", "eager"): [merged((DATA, FORWARD, BACKWARD, OPTIMIZER))],
    ("tensorflow", "compiled"): [merged((DATA, FORWARD, BACKWARD, OPTIMIZER))],
    ("oneflow", "eager"): FOUR,
    ("oneflow", "compiled"): [DATA, merged((FORWARD, BACKWARD, OPTIMIZER))],
    ("paddle", "eager"): FOUR,
    ("paddle", "compiled"): FOUR,
}
# Where the gradient communication can be switched off, on two ranks.
SWITCHED = {("tensorflow", "eager"), ("oneflow", "eager"), ("paddle", "eager"),
            ("paddle", "compiled")}
# Two workers of TensorFlow cannot set their strategy up twice in a process: eager alone (the
# compiled step on CPU workers differs only in where XLA compiles; its names are the same).
TWO_RANKS = {"tensorflow": "eager", "oneflow": "eager,compiled", "paddle": "eager,compiled"}
# OneFlow's eager trainer then its nn.Graph trainer in one process segfaulted in the graph's
# phased steps (eager.Sync) in 4 runs of 100 here, 0 of 100 of each alone (2026-11-26; CI's run
# of that day met it): a rank builds one trainer, so each compiler gets processes of its own.
ONE_TRAINER_A_PROCESS = {"oneflow"}


def run_ranks(python: str, framework: str, compilers: str, world: int) -> list[dict[str, Any]]:
    """Each rank's ``{compiler: phases JSON}``, the ranks started as the plugin's launchers
    start them (the launch variables in the environment), all at once."""
    master, spare, *ports = free_ports(2 + world)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
           "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2", "TF_CPP_MIN_LOG_LEVEL": "2",
           "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master),
           "DLPERF_FRAMEWORK_PORT": str(spare)}
    if framework == "tensorflow" and world > 1:
        env["DLPERF_TEST_WORKERS"] = json.dumps([f"127.0.0.1:{p}" for p in ports])
    ranks = [subprocess.Popen(
        [python, str(REPO / "tests" / "phases_frameworks_mlp_rank.py"), framework, compilers,
         str(STEPS)], env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        stdin=subprocess.DEVNULL) for rank in range(world)]
    out = []
    for proc in ranks:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def python_for(framework: str, request: pytest.FixtureRequest) -> str:
    if framework == "oneflow":
        return str(request.getfixturevalue("oneflow_python"))
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    return sys.executable


@pytest.fixture(scope="module", params=["tensorflow", "oneflow", "paddle"])
def jobs(request: pytest.FixtureRequest) -> tuple[str, dict[int, list[dict[str, Any]]]]:
    """One framework's ranks, once a module: alone (both compilers), and two of them."""
    framework = request.param
    python = python_for(framework, request)

    def ranks(compilers: str, world: int) -> list[dict[str, Any]]:
        if framework not in ONE_TRAINER_A_PROCESS:
            return run_ranks(python, framework, compilers, world)
        runs = [run_ranks(python, framework, one, world) for one in compilers.split(",")]
        return [{k: v for run in by_rank for k, v in run.items()} for by_rank in zip(*runs)]

    return framework, {1: ranks("eager,compiled", 1), 2: ranks(TWO_RANKS[framework], 2)}


def check_phases(found: dict[str, Any], expected: list[str]) -> None:
    """The phases expected, as the step runs them, each of every step > 0."""
    assert found["order"] == expected
    for step in found["with"] + (found["without"] or []):
        assert [name for name in step if name not in (REST, "step")] == expected, step
        assert all(step[name] > 0 for name in expected), step


def test_one_rank_reports_its_phases_and_no_communication(
        jobs: tuple[str, dict[int, list[dict[str, Any]]]]) -> None:
    framework, runs = jobs
    (alone,) = runs[1]
    for compiler, run in alone.items():
        found = run["phases"]
        expected = EXPECTED[framework, compiler]
        check_phases(found, expected)
        assert len(found["with"]) == STEPS and found["without"] is None
        assert found["exposed_s"] is None and found["all_reduce_s"] is None
        assert found["how"] == "one rank: no communication"
        samples = PhaseSamples.of([{"phases": found}])
        assert samples is not None
        figures = samples.figures()
        assert figures.order == [*expected, REST] and figures.exposed_s is None
        assert figures.samples == STEPS and all(figures.seconds[n] > 0 for n in expected)
        assert bool(figures.note) == (compiler == "compiled" or expected != FOUR), figures.note


def test_two_ranks_measure_the_communication_switched_off_where_it_can_be(
        jobs: tuple[str, dict[int, list[dict[str, Any]]]]) -> None:
    framework, runs = jobs
    for compiler in TWO_RANKS[framework].split(","):
        ranks = [rank[compiler]["phases"] for rank in runs[2]]
        switched = (framework, compiler) in SWITCHED
        # Each rank trains on its own batch: the steps without the all-reduce leave the ranks'
        # weights apart; where every step all-reduced, they stay the same to the bit.
        first, second = (rank[compiler]["weights"] for rank in runs[2])
        assert (first != second) == switched, (first, second)
        for found in ranks:
            check_phases(found, EXPECTED[framework, compiler])
            assert found["gradient_bytes"] == GRADIENT_BYTES and found["buckets"] == 1
            assert len(found["all_reduce_s"]) == 3 and len(found["ping_s"]) == 5
            assert all(s > 0 for s in found["all_reduce_s"] + found["ping_s"])
            assert found["how"] and found["how"] != "one rank: no communication"
            if switched:
                assert len(found["without"]) == len(found["exposed_s"]) == STEPS, found
            else:
                assert found["without"] is None and found["exposed_s"] is None, found
                assert "cannot be left out" in found["how"]
        samples = PhaseSamples.of([{"phases": found} for found in ranks])
        assert samples is not None
        figures = samples.figures()
        assert figures.samples == 2 * STEPS
        assert (EXPOSED in figures.seconds) == switched
        assert figures.communication_s and figures.latency_s
        assert figures.gradient_bytes == GRADIENT_BYTES
