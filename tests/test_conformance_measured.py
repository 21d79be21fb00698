"""What the meter sees of every framework's adapter, written once and run for each framework: a
window waits for the steps it times, an own model trains on two nodes, the step is cut into the
phases the framework can tell apart (and the gradient communication left out where it can be),
and ``--dlperf-batch-size max`` searches the framework's own memory. What differs by framework is
said in one table, ``conformance.FRAMEWORKS``; the training contract is
tests/test_conformance.py.

The phases (issue 41) are checked on real ranks of each framework that train a small MLP, then
run the diagnostic steps as a rank does after its timed windows
(``tests/phases_frameworks_mlp_rank.py``); their JSON is what ``core.phases`` pools. Each rank
trains on a batch of its own, so the switch shows in the weights: apart after the steps without
communication, the same to the bit where every step all-reduced. Measured here (2 cores, MLP
16-32-32-4, 2 ranks, backward with / without communication): OneFlow eager 0.94 / 0.45 ms,
Paddle 4.2 / 0.18 ms; each job 1 to 12 s.

The largest batch (issue 16): each probe a fresh launch of that framework's ranks under a memory
limit the OS enforces, and the case measured at the batch found (tests/test_memory_cases.py does
the same, and more, for torch)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conformance import FOUR, Framework, cases, job, left_by
from snippets import REPO, free_ports, run_snippet

from pytest_dlperf.core.phases import EXPOSED, REST, PhaseSamples

# -- a window waits for the steps it times ---------------------------------------------------

def windows(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    for compiler in framework.window.compilers if framework.window else ():
        yield compiler, (framework, compiler), None


@pytest.mark.alone("its control reads a window against an outside clock: beside another "
                   "test's ranks an asynchronous step's window read 0.53 of the clock, not "
                   "under half (MindSpore's compiled step, 2026-11-28)")
@pytest.mark.parametrize("framework, mode", cases(windows))
def test_a_window_agrees_with_a_wall_clock(framework: Framework, mode: str,
                                           tmp_path: Path) -> None:
    """The meter's window over ResNet-50 steps agrees with a wall clock read after a blocking
    loss fetch. The same window with a no-op synchronize is the control: it reads under half
    of that clock where the framework's step returns before its work is done (so the first
    check can fail), and agrees with it where the step is done when it returns (were it not,
    this would say the adapter needs a real wait)."""
    window = framework.window
    assert window is not None
    figures: Any = run_snippet(framework.python(), job(
        {"job": "window", "framework": framework.name, "compiler": mode,
         "steps": window.steps, "warmup": window.warmup}, tmp_path), timeout=600)
    synced, outside = figures["synchronized"]
    assert 0.9 * outside <= synced <= outside
    unsynced, unsynced_outside = figures["not synchronized"]
    if mode in window.asynchronous:
        assert unsynced < 0.5 * unsynced_outside
    else:
        assert 0.9 * unsynced_outside <= unsynced <= unsynced_outside


# -- an own model trains on two nodes --------------------------------------------------------

OWN_MODEL = """
import pytest

from pytest_dlperf import Workload

MLP = Workload("{name}-mlp", recipes={{"{name}": "own_mlp_recipes:{name}"}}, batch_size={{"cpu": 16}},
               sizes={{"width": 32}}, unit="rows")


@pytest.mark.multinode{layouts}
def test_mlp(cluster, {layout}amp, compiler, throughput_meter):
    report = throughput_meter.measure("{name}", MLP)
    assert report.environment["data_parallel_ranks"] == cluster.world_size
    assert report.environment["parameters"] == 32 * 64 + 64 + 64 * 10 + 10
"""


def own_models(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    if framework.own_model:
        yield "", (framework,), framework.own_model.outside_ci


@pytest.mark.usefixtures("subprocess_env")
@pytest.mark.parametrize("framework", cases(own_models))
def test_an_own_model_trains_on_two_nodes(pytester: pytest.Pytester,
                                          framework: Framework) -> None:
    """Two local nodes (as root, two network hosts: the gradients cross the link between them),
    the recipe in a module of its own (an interpreter of the framework's own has no pytest to
    import the test file with)."""
    own = framework.own_model
    assert own is not None
    python = ("--dlperf-python", f"{framework.name}={framework.python()}"
              ) if framework.own_interpreter else ()
    layouts = f"\n@pytest.mark.layouts{own.layouts!r}" if own.layouts else ""
    pytester.makepyfile(own_mlp_recipes=Path(__file__).with_name("own_mlp_recipes.py").read_text(),
                        test_own=OWN_MODEL.format(name=framework.name, layouts=layouts,
                                                  layout="layout, " if own.layouts else ""))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-protocol", "quick", "-m", "multinode", "--nodes",
        "2", "--devices-per-node", "1", "--dlperf-compilers", "eager,compiled", "-k", own.keyword,
        "--dlperf-precisions", "fp32,amp", "--dlperf-json", "r.json", "-rs",
        "--dlperf-launches", "1", "--dlperf-unstable-cv", "50",
        # what is checked is the ranks on two nodes, not a speedup: no 1n1d launch for each case
        "--dlperf-speedup", "off",
        # (a CPU's scaling ladder runs dp alone unless the layouts are named: issue 74)
        *(("--dlperf-layouts", ",".join(own.layouts)) if own.layouts else ()),
        *python, timeout=500)
    result.assert_outcomes(passed=len(own.names), skipped=len(own.names) if own.skipped else 0)
    if own.skipped:
        result.stdout.fnmatch_lines([own.skipped])
    benches = json.loads((pytester.path / "r.json").read_text())["benchmarks"]
    assert sorted(b["name"] for b in benches) == sorted(own.names)
    from pytest_dlperf.launch.onehost import fabric

    for bench in benches:
        info = bench["extra_info"]
        assert info["fingerprint"]["framework"] == framework.name and info["unit"] == "rows"
        assert info["environment"]["compiled"] == bench["name"].endswith("compiled]")
        assert {k: info["environment"][k] for k in own.reports} == own.reports
        assert info["samples_per_s"] > 0
        ranks = info["peak_memory_per_rank"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert all(r["peak_memory_bytes"] > 0 for r in ranks)
        if own.own_step:
            assert all(r["own_step_s"] > 0 for r in ranks)
        if own.phases:  # the step in phases, the communication switched off for half of them
            seconds = info["phases"]["seconds_per_step"]
            assert info["phases"]["communication_s"] > 0
            assert all(value >= 0 for value in seconds.values()), seconds
            assert set(own.reported) <= set(seconds), seconds
            compiler = "compiled" if bench["name"].endswith("compiled]") else "eager"
            assert all(seconds[phase] > 0 for phase in own.phases[compiler]), seconds
        if fabric.available()[0]:
            assert len(set(info["network"]["addresses"])) == 2, info["network"]
    if framework.started:
        assert left_by(framework, pytester.path) == []


# -- the step in phases ----------------------------------------------------------------------

STEPS = 3
GRADIENT_BYTES = 4 * (16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4)  # the MLP's float32 weights


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


def phased(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    if framework.phases:
        yield "", (framework,), None


Runs = dict[int, list[dict[str, Any]]]


@pytest.fixture(scope="module", params=cases(phased))
def jobs(request: pytest.FixtureRequest) -> tuple[Framework, Runs]:
    """One framework's ranks, once a module: alone (every compiler), and two of them."""
    framework = request.param
    phases = framework.phases
    assert phases is not None
    python = framework.python()

    def ranks(compilers: tuple[str, ...], world: int) -> list[dict[str, Any]]:
        if not phases.one_trainer_a_process:
            return run_ranks(python, framework.name, ",".join(compilers), world)
        runs = [run_ranks(python, framework.name, one, world) for one in compilers]
        return [{k: v for run in by_rank for k, v in run.items()} for by_rank in zip(*runs)]

    return framework, {1: ranks(tuple(phases.expected), 1), 2: ranks(phases.two_ranks, 2)}


def check_phases(found: dict[str, Any], expected: tuple[str, ...]) -> None:
    """The phases expected, as the step runs them, each of every step > 0."""
    assert found["order"] == list(expected)
    for step in found["with"] + (found["without"] or []):
        assert [name for name in step if name not in (REST, "step")] == list(expected), step
        assert all(step[name] > 0 for name in expected), step


def test_one_rank_reports_its_phases_and_no_communication(
        jobs: tuple[Framework, Runs]) -> None:
    framework, runs = jobs
    assert framework.phases is not None
    (alone,) = runs[1]
    for compiler, run in alone.items():
        found = run["phases"]
        expected = framework.phases.expected[compiler]
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
        jobs: tuple[Framework, Runs]) -> None:
    framework, runs = jobs
    phases = framework.phases
    assert phases is not None
    for compiler in phases.two_ranks:
        ranks = [rank[compiler]["phases"] for rank in runs[2]]
        switched = compiler in phases.switched
        # Each rank trains on its own batch: the steps without the all-reduce leave the ranks'
        # weights apart; where every step all-reduced, they stay the same to the bit.
        first, second = (rank[compiler]["weights"] for rank in runs[2])
        assert (first != second) == switched, (first, second)
        for found in ranks:
            check_phases(found, phases.expected[compiler])
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


# -- the largest batch that fits -------------------------------------------------------------

MAX_BATCH_TEST = """
from wide_recipes import WIDE


def test_wide(throughput_meter):
    throughput_meter.measure("{name}", WIDE)
"""


def max_batches(framework: Framework) -> Iterator[tuple[str, tuple[Any, ...], str | None]]:
    if framework.max_batch:
        yield "", (framework,), framework.max_batch.outside_ci


@pytest.mark.usefixtures("subprocess_env")
@pytest.mark.parametrize("framework", cases(max_batches))
def test_batch_size_max_searches_the_frameworks_own_memory(pytester: pytest.Pytester,
                                                           framework: Framework) -> None:
    python = framework.python()
    pytester.makepyfile(wide_recipes=Path(__file__).with_name("wide_recipes.py").read_text(),
                        test_w=MAX_BATCH_TEST.format(name=framework.name))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--devices-per-node", "1",
        *(("--dlperf-python", f"{framework.name}={python}") if framework.own_interpreter
          else ()),
        "--dlperf-warmup-steps", "2", "--dlperf-steps", "2", "--dlperf-repeats", "1",
        "--dlperf-max-repeats", "1", "--dlperf-launches", "1", "--dlperf-unstable-cv", "10",
        "--dlperf-baselines", "bl", "--dlperf-batch-size", "max",
        "--dlperf-memory-limit", "512M", "--dlperf-json", "r.json", timeout=400)
    result.assert_outcomes(passed=1)
    (bench,) = json.loads(Path(pytester.path / "r.json").read_text())["benchmarks"]
    info = bench["extra_info"]
    assert info["fingerprint"]["framework"] == framework.name
    assert info["fingerprint"]["batch_size"] == "max"
    searched = info["batch_search"]
    found = searched["found"]
    assert info["batch_size"] == found
    # The edge, each side a fresh launch of this framework's ranks: the found batch trained,
    # one more was ended for lack of memory (the cgroup's OOM killer, or the framework's own
    # error under an address-space limit), and was reported as such: by its probe, or by the
    # measurement at it after its probe fitted (a batch at the edge does not fit every time:
    # the search steps one down, core.batchsearch's retreat; TensorFlow's did in CI).
    probes = {p["batch"]: p for p in searched["probes"] if p["stage"] == "probe"}
    over = [p for p in searched["probes"] if p["batch"] == found + 1 and not p["fits"]]
    assert over, searched
    assert f"ran out of memory at batch {found + 1}" in over[0]["message"]
    if over[0]["stage"] == "probe":
        assert probes[found]["fits"]
    else:  # a retreat: the measurement ran out where a probe had fitted
        assert over[0]["stage"] == "measurement" and probes[found + 1]["fits"]
    assert 2 <= found < 30, "512 MiB should bound this workload within a few dozen"
    assert info["peak_memory_bytes"] > 0 and info["samples_per_s"] > 0
    result.stdout.fnmatch_lines([f"*test_wide*max={found}*"])
