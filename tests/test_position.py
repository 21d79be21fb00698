"""A case whose first launch of each run reads apart from the others (``verdict.position``), on
numbers alone: the issue's sessions, launches alike, a machine that drifts, and what the
verdict tells the user."""

from __future__ import annotations

import math
import random

from pytest_dlperf.core.protocol import QUICK, Result
from pytest_dlperf.core.topology import Topology
from pytest_dlperf.core.workload import CaseWorkload, Precision
from pytest_dlperf.verdict import decide, position
from pytest_dlperf.verdict.record import CaseReport
from pytest_dlperf.verdict.stats import NO_BASELINE, Verdict

# Three sessions of the issue's MLP (samples/s, two windows a launch) while the FLOP count ran
# before launch 1's windows.
SESSIONS = [
    [[29876, 29667], [21899, 22035], [20446, 23899]],
    [[30922, 32551], [21036, 21681], [22253, 23313]],
    [[28012, 31803], [19011, 19903], [18402, 19107]],
]


def test_the_issues_first_launches_are_named_with_their_ratio() -> None:
    found = position.first_launch_apart(SESSIONS)
    assert found is not None
    # Launch 1 against the mean of the others' medians, session by session: 29,771 against
    # ~22,000 in the first (1.35x), the issue's 1.29-1.76x.
    assert 1.29 < min(found.runs) < max(found.runs) < 1.76
    assert min(found.runs) < found.ratio < max(found.runs)
    assert found.p < position.ALPHA and found.df == 3  # 3 runs x (3 - 2) launches
    assert found.describe("samples").startswith(
        f"launch 1 of each run read {found.ratio:.2f}x the run's other launches in samples/s "
        "(faster; 3 runs: 1.35x, 1.44x, 1.57x; p = ")
    # A first launch as far apart the other way is named too, as slower.
    slower = position.first_launch_apart([[[v * 0.45 for v in run[0]], *run[1:]]
                                          for run in SESSIONS])
    assert slower is not None and slower.ratio < 1 and "(slower;" in slower.describe("x")


def test_one_run_cannot_tell_a_first_launch_from_the_machine_drifting() -> None:
    assert position.first_launch_apart(SESSIONS[:1]) is None
    assert position.first_launch_apart([run[:2] for run in SESSIONS]) is None  # 2 launches


def test_launches_alike_or_apart_at_random_are_not_named() -> None:
    rng = random.Random(7)
    named = 0
    for _ in range(400):
        # Launches 5% apart (log sd), windows 1%; the machine's level moving 10% between runs.
        runs = []
        for _ in range(3):
            level = 20000 * math.exp(rng.gauss(0, 0.10))
            runs.append([[level * math.exp(rng.gauss(0, 0.05) + rng.gauss(0, 0.01))
                          for _ in range(2)] for _ in range(3)])
        named += position.first_launch_apart(runs) is not None
    assert named <= 8  # ALPHA is 1%: ~4 of 400 by chance


def test_a_small_step_the_windows_cannot_tell_apart_is_not_named() -> None:
    # Launch 1 0.5% faster in every run, the others exactly alike: significant, but the
    # windows themselves vary 2%.
    runs = [[[100.5 * (1 + d), 100.5 * (1 - d)], [100.0 * (1 + d), 100.0 * (1 - d)],
             [100.0 * (1 - d), 100.0 * (1 + d)]] for d in (0.02, 0.025, 0.02)]
    assert position.first_launch_apart(runs) is None
    # The same step well beyond the windows' noise is named.
    runs = [[[120.0 * (1 + d), 120.0 * (1 - d)], [100.0 * (1 + d), 100.0 * (1 - d)],
             [100.5 * (1 - d), 100.5 * (1 + d)]] for d in (0.02, 0.025, 0.02)]
    assert position.first_launch_apart(runs) is not None


def test_a_baseline_is_cut_into_its_runs_and_a_run_the_limit_trimmed_is_left_out() -> None:
    launches = [[float(i)] for i in range(1, 9)]
    assert position.baseline_runs(launches, [3, 3, 2]) == [
        [[1.0], [2.0], [3.0]], [[4.0], [5.0], [6.0]], [[7.0], [8.0]]]
    # At the limit, the oldest run may have lost its first launches.
    assert position.baseline_runs(launches, [2, 3, 3], keep=8) == [
        [[3.0], [4.0], [5.0]], [[6.0], [7.0], [8.0]]]
    assert position.baseline_runs(launches, [3, 3]) == []  # runs that do not add up


def _report(**kw: object) -> CaseReport:
    samples = [v for run in SESSIONS[2:] for launch in run for v in launch]
    result = Result(samples_per_s=samples, window_s=[1.0] * len(samples), steps=100,
                    global_batch=128, warmup_s=1.0, wall_s=10.0, launch_windows=[2, 2, 2])
    return CaseReport(
        case="test_mlp.py::test_mlp", name="test_mlp", nodeid="x", params={},
        framework="torch", framework_version="2", topology=Topology(1, 1, "cpu", "cpu"),
        precision=Precision("fp32", "cpu"), workload=CaseWorkload("mlp", "samples", 128, {}),
        protocol=QUICK, result=result, verdict=Verdict(NO_BASELINE, measured=20000.0), **kw)


def test_the_verdict_tells_the_user_what_the_first_launch_did_and_why_it_may() -> None:
    found = position.first_launch_apart(SESSIONS)
    told = decide.decide(_report(launch_position=found), decide.Policy(tolerance=0.05,
                                                                       repeats=6, max_repeats=6))
    [warning] = [w for w in told.warnings if "differ by position" in w]
    assert warning.startswith("pytest-dlperf: test_mlp.py::test_mlp's launches differ by "
                              "position: launch 1 of each run read 1.45x")
    assert "faster; 3 runs: 1.35x, 1.44x, 1.57x" in warning
    assert "a cache the first launch fills" in warning and "--dlperf-allocator" in warning
    quiet = decide.decide(_report(), decide.Policy(tolerance=0.05, repeats=6, max_repeats=6))
    assert not [w for w in quiet.warnings if "differ by position" in w]


def test_the_meter_judges_a_baselines_runs_and_this_one_and_not_runs_from_before() -> None:
    from dataclasses import replace

    from pytest_dlperf.plugin.meter import ThroughputMeter
    from pytest_dlperf.store.baselines import THROUGHPUT, Baseline, Metric, Run

    def result(run: list[list[int]]) -> Result:
        samples = [float(v) for launch in run for v in launch]
        return Result(samples_per_s=samples, window_s=[1.0] * len(samples), steps=100,
                      global_batch=128, warmup_s=1.0, wall_s=10.0,
                      launch_windows=[len(launch) for launch in run])

    launches = [[float(v) for v in launch] for run in SESSIONS[:2] for launch in run]
    baseline = Baseline("c", {"allocator": "glibc mmap=32M trim=64M"},
                        {THROUGHPUT: Metric(launches, 22000.0)},
                        runs=[Run(None, None, None, 3), Run(None, None, None, 3)])
    policy = decide.Policy(tolerance=0.05, repeats=6, max_repeats=6)
    # The baseline's two runs and this one, launch 1 apart in each.
    found = ThroughputMeter._position(baseline, result(SESSIONS[2]), policy)
    assert found is not None and len(found.runs) == 3
    # This run judged after one launch: the baseline's two runs tell it alone.
    assert ThroughputMeter._position(baseline, result(SESSIONS[2][:1]), policy) is not None
    # Runs recorded before launches started alike (no allocator in the fingerprint: launch 1
    # counted FLOPs first) are not evidence of the workload's own: this run alone cannot tell.
    before = replace(baseline, fingerprint={})
    assert ThroughputMeter._position(before, result(SESSIONS[2]), policy) is None
    # A baseline at its launch limit: its oldest run may have lost its launch 1.
    full = replace(policy, keep_launches=6)
    assert ThroughputMeter._position(baseline, result(SESSIONS[2][:1]), full) is None
