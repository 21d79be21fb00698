"""A busy machine is seen and said, never judged as code: the messages (verdict/busy.py) on
numbers, bisect's outcome for a case left unjudged, and the acceptance test: an unchanged case
beside CPU hogs fails as machine busy, not as a regression, and its recording run records
nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from numpy_mlp import ADAPTER, ONE

from pytest_dlperf import bisect
from pytest_dlperf.core.interference import GpuProcess, Interference
from pytest_dlperf.verdict import busy

pytestmark = pytest.mark.alone(
    "it measures the machine's load from other processes, which a neighbour is")

QUIET = Interference(5.0, 2, 0.05, 0.0, 0.5)
HOGGED = Interference(5.0, 2, 0.48, 0.0, 0.5)


def test_busy_is_others_cpu_and_steal_above_the_threshold_and_1_turns_it_off() -> None:
    assert not busy.is_busy(QUIET, 0.25) and busy.is_busy(HOGGED, 0.25)
    assert busy.is_busy(Interference(5.0, 2, 0.15, 0.12, 0.5), 0.25)  # steal counts too
    assert not busy.is_busy(Interference(5.0, 2, 0.25, 0.0, 0.5), 0.25)  # above, not at
    assert not busy.is_busy(Interference(5.0, 2, 1.0, 0.5, 0.0), 1.0)
    assert not busy.is_busy(Interference(5.0, 2, None, None, None), 0.0)  # nothing measured


def test_the_message_names_what_was_measured_the_launch_the_retries_and_why() -> None:
    text = busy.message("t.py::test_a[1n1d]", HOGGED, "launch 2/3", 2, 0.25, recording=False)
    assert text.startswith("pytest-dlperf: MACHINE BUSY, t.py::test_a[1n1d] not judged: ")
    assert ("others used 48% of the 2 cores, steal 0%, during launch 2/3 (above "
            "--dlperf-busy-threshold 25%); retried twice; the baseline never shared this "
            "interference, so the case is not judged.") in text
    assert "REGRESSION" not in text
    # what to do: a quieter machine, A/B, or (issue 74) ranks on fewer cores than the other
    # job leaves them, a case of its own
    assert "(--dlperf-ab)" in text and "taskset -c 0 pytest" in text
    assert "a case of their own, with a baseline of their own" in text
    recording = busy.message("t.py::test_a", HOGGED, "launch 1/1", 1, 0.25, recording=True)
    assert "; retried once; nothing was recorded: " in recording
    gpus = Interference(5.0, 8, 0.01, 0.0, 0.1, (GpuProcess(4242, 5000.0),))
    assert busy.describe(gpus) == ("others used 1% of the 8 cores, steal 0%; 1 other "
                                   "process(es) on the GPUs: pid 4242 (5,000 MiB)")
    assert busy.describe(Interference(5.0, 1, 0.3, 0.05, 0.6)) == (
        "others used 30% of the 1 core, steal 5%")
    assert busy.summary_line(3) == "3 case(s) not judged: the machine was busy"


def _probe(outcomes: list[str], busy_cases: int) -> dict[str, object]:
    benchmarks = [{"extra_info": {"case": f"t.py::test_{i}", "ab": {
        "outcome": outcome, "ratio": 1.0, "ratio_ci": [0.9, 1.1], "pairs": [1, 2]}}}
        for i, outcome in enumerate(outcomes)]
    unjudged = [{"case": f"t.py::test_busy{i}", "outcome": busy.MACHINE_BUSY}
                for i in range(busy_cases)]
    return {"benchmarks": benchmarks, "dlperf_not_judged": unjudged}


def test_bisect_takes_a_machine_busy_case_as_neither_slow_nor_fast() -> None:
    assert bisect.classify(_probe(["pass"], 1))[0] == bisect.BUSY
    assert bisect.classify(_probe([], 1))[0] == bisect.BUSY
    assert bisect.classify(_probe(["regression"], 1))[0] == bisect.SLOW  # proven anyway
    assert bisect.classify(_probe(["pass"], 0))[0] == bisect.NOT_SLOW
    lines = bisect.classify(_probe([], 1))[1]
    assert lines == ["t.py::test_busy0: not judged, machine-busy"]


ARGS = ["-p", "no:cacheprovider", "--dlperf-warmup-steps", "2", "--dlperf-steps", "50",
        "--dlperf-repeats", "2", "--dlperf-baselines", "bl", "--dlperf-machine", "box",
        "--dlperf-unstable-cv", "10", "--dlperf-devices-per-node", "1", "-rA"]
BUSY = ["--dlperf-busy-threshold", "0.25"]


@pytest.mark.usefixtures("subprocess_env")
def test_an_unchanged_case_beside_cpu_hogs_fails_as_machine_busy_not_as_a_regression(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mlp=ONE, numpy_mlp_adapter=ADAPTER)
    # Recorded whatever else shares this host now (other jobs' load is not what this test is
    # about): the check off.
    recorded = pytester.runpytest_subprocess(
        *ARGS, "--dlperf-update-baselines", "--dlperf-busy-threshold", "1",
        "--dlperf-json", "r0.json", timeout=300)
    recorded.assert_outcomes(passed=1)
    (baseline,) = (pytester.path / "bl" / "box").rglob("*.json")
    kept = baseline.read_text()
    (seen,) = json.loads((pytester.path / "r0.json").read_text())[
        "benchmarks"][0]["extra_info"]["interference"]
    assert seen["cores"] >= 1 and 0 <= seen["others_cpu"] <= 1 and seen["retries"] == 0

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        # The hogs are this test's children, not the child pytest's: others to it.
        # (the default threshold: the suite's environment turns the check off)
        judged = pytester.runpytest_subprocess(*ARGS, *BUSY, "--dlperf-json", "r1.json",
                                               timeout=300)
        again = pytester.runpytest_subprocess(*ARGS, *BUSY, "--dlperf-update-baselines=add",
                                              timeout=300)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()

    judged.assert_outcomes(failed=1)
    judged.stdout.fnmatch_lines([
        "*pytest-dlperf: MACHINE BUSY, test_mlp.py::test_one not judged: others used "
        "*% of the * cores, steal *%, during launch 1/1 (above --dlperf-busy-threshold 25%); "
        "retried twice; the baseline never shared this interference, so the case is not "
        "judged.*",
        "pytest-dlperf: 1 case(s) not judged: the machine was busy"])
    # Issue 52: each retry labelled as one (all three read "launch 1/3" before), and what was
    # measured shown, marked (a run of busy cases printed no figures at all).
    judged.stdout.fnmatch_lines([
        "pytest-dlperf: test_one launch 1/1: window 1/2 * samples/s",
        "pytest-dlperf: test_one launch 1/1, retry 1 of 2 (machine busy): window 1/2 *",
        "pytest-dlperf: test_one launch 1/1, retry 2 of 2 (machine busy): window 2/2 *",
        "*- pytest-dlperf: measured beside a busy machine, not judged (the machine's figures, "
        "not the code's) -*",
        "test_mlp.py::test_one  1 * samples/s  *-*  2 * *%  *not judged: machine busy in "
        "launch 1/1"])
    assert "REGRESSION" not in judged.stdout.str()
    (unjudged,) = json.loads((pytester.path / "r1.json").read_text())["dlperf_not_judged"]
    assert unjudged["outcome"] == "machine-busy" and unjudged["retries"] == 2
    measured = unjudged["measured"]
    assert measured["unit"] == "samples" and len(measured["launches"]) == 1
    assert len(measured["launches"][0]) == 2 and measured["median"] > 0
    assert unjudged["interference"]["others_cpu"] > 0.25
    assert json.loads((pytester.path / "r1.json").read_text())["benchmarks"] == []

    # Recording beside them: nothing recorded, the case fails the same way.
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*MACHINE BUSY*retried twice; nothing was recorded*",
                                "pytest-dlperf: 1 case(s) not judged: the machine was busy"])
    assert [p.read_text() for p in (pytester.path / "bl" / "box").rglob("*.json")] == [kept]


def test_a_threshold_outside_0_to_1_is_a_usage_error_naming_the_flag(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("--dlperf-busy-threshold", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value for --dlperf-busy-threshold=0: expected a share of "
                                 "the machine in (0, 1]*"])
    pytester.runpytest("--dlperf-busy-threshold", "100%").assert_outcomes(passed=1)
