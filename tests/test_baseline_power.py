"""The nightly baseline mode with power (issue 39): a new user's model got ~28% slower against a
baseline of three runs, and passed as "inconclusive" every time, because the between-run drift
came from that one case's three runs (two degrees of freedom). Here real pytest sessions record
a machine's baselines over three runs and judge a slower model against them: the drift pooled
over the machine's cases (``verdict.drift``) proves the drop. Real torch ranks on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# ~80 s of CI's alone pass (quiet here, 2026-12-06: 141 s with three launches a run, 115 s with
# two, 78-79 s with one): one trial of a power that benchmarks/baseline_runs.py measures over 400
# (docs/measurements.md, "The gate's power"), skipped on a machine that drifts between runs.
pytestmark = [pytest.mark.usefixtures("subprocess_env"),
              pytest.mark.alone("it judges slowdowns made between runs by their timings")]

# One model whose hidden width the test changes between the recording and the judging runs
# (the user's "wider model": code, not a size of the fingerprint), and two that stay as they
# were: three cases of one machine, whose runs give the pooled drift its degrees of freedom.
PERF = """
import pytest
import torch

from pytest_dlperf import Parts, Workload

HIDDEN = {hidden}


def mlp(ctx):
    width = int(ctx.sizes["width"])
    hidden = HIDDEN if ctx.sizes.get("changed") else 4 * width
    model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(),
                                torch.nn.Linear(hidden, width), torch.nn.GELU(),
                                torch.nn.Linear(width, 10))
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, width),
                 targets=torch.randint(0, 10, (ctx.batch_size,)))


def workload(width, changed=0):
    return Workload(f"mlp{{width}}", recipes={{"torch": mlp}}, batch_size={{"cpu": 64}},
                    sizes={{"width": width, "changed": changed}})


def test_changed(cluster, throughput_meter):
    throughput_meter.measure("torch", workload(256, changed=1))


@pytest.mark.parametrize("width", [192, 320])
def test_unchanged(cluster, width, throughput_meter):
    throughput_meter.measure("torch", workload(width))
"""

# 300-step windows (~0.7 s here): with 40 (~0.08 s) a window was as much noise as signal, the
# launches of one run spread ~8%, and the 28% slower model came out inconclusive in about one
# judging run of two (CI of 3ea4d41; here: -25.9%, p 0.010 against alpha 0.005, the spread 6.8%);
# at 300 the same verdict read -28.5%, spread 2.7%, p 2e-5, for 20 s more. One launch a run (a
# run's drift is between its runs, not its launches): with two, -26.6% and -24.7%, both
# regressions, in two quiet runs of 115 s (141 s with three); with one, -24.4% and a regression
# in each of two quiet runs of 78-79 s (2026-12-06).
RUN = ["-p", "no:cacheprovider", "--devices-per-node", "1", "--dlperf-protocol", "quick",
       "--dlperf-steps", "300", "--dlperf-launches", "1", "--dlperf-baselines", "bl",
       "--dlperf-machine", "box", "--dlperf-precisions", "fp32"]
# The pooled drift between runs above which a 28% drop cannot be proven from three runs at the
# verdict's level (t ~3.7 with six degrees of freedom, times sqrt(1 + 1/3) runs' worth of
# spread): a quiet machine's recordings read 2-3%. Such a machine is what this test is about;
# these VMs are not always one. CI's run of 2026-11-26 recorded its second run ~30% slower in
# every case (a neighbour: 30k against 46k, 52k against 73k samples/s), and the verdict was,
# honestly, inconclusive; the same evening here a recording drifted 6.4% (runs of 41-46k) and the
# wider model read -31.1% at p=0.011, then in a later session -46.7%. A judging whose own
# evidence says the machine moved is not what this test is about: a change beyond DOUBT_FACTOR
# (the judging run moved) is judged again, once; an inconclusive verdict over a drift beyond this
# (the recording moved) must still not pass, and the test skips saying so. Recording again cost
# ~105 s and, on the evening above, met a moving machine again two times in three.
DRIFTED = 0.07


def verdicts(path: Path) -> dict[str, dict[str, object]]:
    return {b["name"]: b["extra_info"]["verdict"]
            for b in json.loads(path.read_text())["benchmarks"]}


def record(pytester: pytest.Pytester) -> None:
    """Three runs of the three cases recorded as the machine's baselines."""
    perf = pytester.path / "test_models.py"
    perf.write_text(PERF.format(hidden=1024))
    for number, update in enumerate(("all", "add", "add")):
        # The recording rule (--dlperf-unstable-cv) is tested on its own; here a window that a
        # CI neighbour slowed (a fresh clone's run once read 31k among 43k samples/s, 12.5%
        # within launches) must not stop the three runs this verdict is judged by.
        recorded = pytester.runpytest_subprocess(*RUN, f"--dlperf-update-baselines={update}",
                                                 "--dlperf-unstable-cv", "30",
                                                 "--dlperf-json", f"r{number}.json",
                                                 timeout=600)
        recorded.assert_outcomes(passed=3)
    # 1.625x the hidden width: -28% to -33% samples/s on a quiet VM here (1.45x: -19%; 1.75x:
    # -28% to -52%, too near the 2x that the drift does not decide).
    perf.write_text(PERF.format(hidden=1664))


def judge(pytester: pytest.Pytester, name: str) -> tuple[dict[str, object], pytest.RunResult]:
    """The wider model judged against the recorded runs: its verdict and the session."""
    judged = pytester.runpytest_subprocess(*RUN, "-k", "test_changed", "--dlperf-json",
                                           f"{name}.json", timeout=600)
    return verdicts(pytester.path / f"{name}.json")["test_changed[1n1d]"], judged


def moved(verdict: dict[str, object]) -> bool:
    """Whether the judging's own evidence says the machine moved more than this test is about."""
    return bool(verdict["beyond_doubt"]) or (verdict["outcome"] == "inconclusive"
                                             and float(verdict["spread"]) > DRIFTED)  # type: ignore[arg-type]


def test_a_28_percent_slower_model_fails_against_a_three_run_baseline(
        pytester: pytest.Pytester) -> None:
    record(pytester)
    verdict, judged = judge(pytester, "j")
    if verdict["beyond_doubt"]:
        print(f"the judging run moved (delta {verdict['delta']:+.1%}): judged again")
        verdict, judged = judge(pytester, "j-again")
    # Judged by the machine's pooled drift, whatever came out.
    assert verdict["level"] == "machine", verdict
    judged.stdout.fnmatch_lines(["*test_models.py::test_changed[[]1n1d[]]*"
                                 "pooled over 9 runs of 3 cases on this machine*"])
    delta = float(verdict["delta"])  # type: ignore[arg-type]
    if moved(verdict):
        # Never a pass on a moving machine; a drop it cannot prove is said to be so.
        assert verdict["outcome"] in ("inconclusive", "regression"), verdict
        pytest.skip(f"the machine moved (drift {verdict['spread']:.1%}, "
                    f"delta {delta:+.1%}, {verdict['outcome']}): the power this test is about "
                    f"needs a machine that drifts less than {DRIFTED:.0%} between runs")
    # The slowdown this test is about: -26% to -33% here, but -14.9% on CI's machine of
    # 2026-12-07 (a CPU half as fast, 24k samples/s where this VM reads 43k, on which the wider
    # GEMMs cost relatively less), where the product's verdict is what is tested: markedly
    # slower, short of the 2x the drift does not decide.
    assert -0.5 < delta < -0.10, verdict
    assert verdict["outcome"] == "regression", verdict
    assert not verdict["beyond_doubt"], verdict  # proven by the drift, not beyond it
    judged.assert_outcomes(failed=1)
    judged.stdout.fnmatch_lines(["*REGRESSION in test_models.py::test_changed[[]1n1d[]]*"])
