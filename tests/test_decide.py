"""The decision half of a case, on numbers alone: verdicts, extra repeats, recording, and what
the user is told. Nothing is launched (the same paths through real training are in test_e2e)."""

from __future__ import annotations

import pytest

from pytest_dlperf import decide
from pytest_dlperf.baselines import EFFICIENCY, THROUGHPUT, Baseline, Change, Metric
from pytest_dlperf.protocol import QUICK, Result
from pytest_dlperf.report import CaseReport
from pytest_dlperf.stats import INCONCLUSIVE, NO_BASELINE, PASS, REGRESSION, Verdict
from pytest_dlperf.topology import Topology
from pytest_dlperf.workload import CaseWorkload, Precision

POLICY = decide.Policy(tolerance=0.05, repeats=5, max_repeats=15)
STEADY = [100.0, 100.5, 99.5, 100.2, 99.8]


def baseline(throughput: list[float], efficiency: list[float] | None = None) -> Baseline:
    metrics = {THROUGHPUT: Metric(throughput, sorted(throughput)[len(throughput) // 2])}
    if efficiency is not None:
        metrics[EFFICIENCY] = Metric(efficiency, sorted(efficiency)[len(efficiency) // 2])
    return Baseline(case="c", fingerprint={}, metrics=metrics)


def report(samples: list[float], verdict: Verdict, efficiency: Verdict | None = None,
           **kw: object) -> CaseReport:
    result = Result(samples_per_s=samples, window_s=[1.0] * len(samples), steps=10,
                    global_batch=4, warmup_s=1.0, wall_s=10.0)
    data: dict = dict(
        case="perf/test_m.py::test_m[1n2d]", name="test_m[1n2d]", nodeid="x", params={},
        framework="torch", framework_version="2", topology=Topology(1, 2, "cpu", "cpu"),
        precision=Precision("fp32", "cpu"), workload=CaseWorkload("m", "tokens", 2, {}),
        protocol=QUICK, result=result, verdict=verdict, efficiency_verdict=efficiency,
        baseline_path="baselines/x.json", speedup=1.2)
    data.update(kw)
    return CaseReport(**data)


def test_looks_count_the_batches_of_extra_repeats() -> None:
    assert POLICY.looks == 3  # 5, then 10, then 15 windows
    assert decide.Policy(0.05, 5, 12).looks == 3  # the last batch is partial
    assert decide.Policy(0.05, 5, 5).looks == 1
    assert decide.Policy(0.05, 5, 15, can_add_repeats=False).looks == 1


def test_a_clear_drop_is_a_regression_and_gets_no_more_repeats() -> None:
    verdict, efficiency = decide.verdicts([80.0, 80.2, 79.9, 80.1, 79.8], baseline(STEADY), None,
                                          2, 0.05, POLICY)
    assert verdict.outcome == REGRESSION and efficiency is None
    assert decide.more_repeats(verdict, efficiency, 5, POLICY) == 0
    outcome = decide.decide(report([80.0] * 5, verdict), POLICY)
    assert outcome.failure is not None
    assert outcome.failure.startswith("pytest-dlperf: REGRESSION in perf/test_m.py::test_m[1n2d]: "
                                      "tokens/s median 80.00 is below the threshold 95.00")


def test_an_inconclusive_verdict_asks_for_a_batch_of_repeats_up_to_the_maximum() -> None:
    noisy = [60.0, 140.0, 90.0, 70.0, 120.0]
    verdict, efficiency = decide.verdicts(noisy, baseline(STEADY), None, 2, 0.05, POLICY)
    assert verdict.outcome == INCONCLUSIVE
    assert decide.more_repeats(verdict, efficiency, 5, POLICY) == 5
    assert decide.more_repeats(verdict, efficiency, 12, POLICY) == 3  # up to 15 in all
    assert decide.more_repeats(verdict, efficiency, 15, POLICY) == 0
    for policy in (decide.Policy(0.05, 5, 15, update="all"),
                   decide.Policy(0.05, 5, 15, can_add_repeats=False)):
        assert decide.more_repeats(verdict, efficiency, 5, policy) == 0
    warned = decide.decide(report(noisy, verdict), POLICY)
    assert warned.failure is None and warned.warnings[-1].startswith(
        "pytest-dlperf: INCONCLUSIVE perf/test_m.py::test_m[1n2d]: tokens/s median")
    strict = decide.decide(report(noisy, verdict), decide.Policy(0.05, 5, 15, strict=True))
    assert strict.failure is not None and strict.failure.endswith("(failing: --dlperf-strict)")


def test_a_scaling_regression_fails_even_when_throughput_passes() -> None:
    efficiencies = decide.efficiencies(STEADY, 60.0, 2)
    assert efficiencies == pytest.approx([s / 120.0 for s in STEADY])
    # The baseline scaled at ~95%; now the same throughput is ~83% of 2 x 60.
    verdict, efficiency = decide.verdicts(STEADY, baseline(STEADY, [0.95, 0.951, 0.949, 0.95,
                                                                      0.952]), 60.0, 2, 0.05,
                                          POLICY)
    assert verdict.outcome == PASS and efficiency is not None
    assert efficiency.outcome == REGRESSION
    outcome = decide.decide(report(STEADY, verdict, efficiency), POLICY)
    assert outcome.failure is not None and "SCALING REGRESSION" in outcome.failure
    assert decide.more_repeats(verdict, efficiency, 5, POLICY) == 0


def test_no_baseline_warns_or_fails_under_strict_and_records_when_asked() -> None:
    verdict, _ = decide.verdicts(STEADY, None, None, 1, 0.05, POLICY)
    assert verdict.outcome == NO_BASELINE
    warned = decide.decide(report(STEADY, verdict), POLICY)
    assert warned.failure is None and "no baseline for" in warned.warnings[0]
    assert "100.00 tokens/s" in warned.warnings[0]
    assert decide.decide(report(STEADY, verdict), decide.Policy(0.05, 5, 15, strict=True)).failure
    assert decide.records(decide.Policy(0.05, 5, 15, update="missing"), has_baseline=False)
    assert not decide.records(decide.Policy(0.05, 5, 15, update="missing"), has_baseline=True)
    assert decide.records(decide.Policy(0.05, 5, 15, update="all"), has_baseline=True)
    assert not decide.records(POLICY, has_baseline=False)


def test_a_recorded_case_is_not_judged_but_an_unstable_one_is_still_flagged() -> None:
    noisy = [60.0, 140.0, 90.0, 70.0, 120.0]
    verdict, _ = decide.verdicts(noisy, None, None, 1, 0.05, POLICY)
    recorded = report(noisy, verdict, cv=0.35,
                      baseline_change=Change(path=None, action="recorded",  # type: ignore[arg-type]
                                             new=baseline(noisy)))
    outcome = decide.decide(recorded, POLICY)
    assert outcome.failure is None
    assert len(outcome.warnings) == 1 and "is unstable" in outcome.warnings[0]
