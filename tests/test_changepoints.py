"""Change points over a case's history: the detector on series whose steps are known, the
gate's rule (the newest step, for the worse, unaccepted), and the gate through the plugin: real
runs into a real SQLite history whose earlier nights ran ten times as fast."""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy_mlp import ADAPTER, ONE
from test_history import RUN

from pytest_dlperf.store.history import History, Point
from pytest_dlperf.verdict.changepoints import blocking, detect, steps

pytestmark = pytest.mark.alone("its gate judges tonight's timings against recorded nights")


def noisy(level: float, n: int, rng: random.Random, cv: float = 0.01) -> list[float]:
    return [level * (1 + rng.gauss(0, cv)) for _ in range(n)]


def test_a_step_is_found_where_it_is_with_the_levels_either_side() -> None:
    rng = random.Random(7)
    values = noisy(100, 30, rng) + noisy(93, 6, rng)
    (cp,) = detect(values)
    assert cp.index == 30
    assert cp.before == pytest.approx(100, rel=0.01) and cp.after == pytest.approx(93, rel=0.01)
    assert cp.change == pytest.approx(-0.07, abs=0.01) and cp.pvalue < 1e-6
    assert detect(values) == [cp]  # deterministic: the same history, the same answer


def test_noise_alone_has_no_step() -> None:
    rng = random.Random(3)
    assert detect(noisy(100, 80, rng, cv=0.05)) == []


def test_a_regression_and_its_fix_are_two_steps() -> None:
    rng = random.Random(11)
    values = noisy(100, 20, rng) + noisy(80, 10, rng) + noisy(100, 10, rng)
    assert [(cp.index, round(cp.change, 1)) for cp in detect(values)] == [(20, -0.2), (30, 0.2)]


def test_one_wild_night_is_not_a_step() -> None:
    rng = random.Random(5)
    values = noisy(100, 20, rng) + [60.0] + noisy(100, 10, rng)
    assert detect(values) == []
    # ... but the same drop on two nights in a row is one, even at the end of the series
    (cp,) = detect(noisy(100, 20, rng) + [60.0, 61.0])
    assert cp.index == 20


def test_too_short_a_history_has_no_step_and_bad_input_is_refused() -> None:
    assert detect([1.0, 2.0, 3.0]) == []
    with pytest.raises(ValueError, match="finite"):
        detect([1.0, float("nan"), 2.0, 3.0])
    with pytest.raises(ValueError, match="min_size must be at least 1"):
        detect([1.0, 2.0], min_size=0)
    with pytest.raises(ValueError, match="max_pvalue"):
        detect([1.0, 2.0], max_pvalue=1.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1, 1000), min_size=4, max_size=40),
       st.floats(0.01, 100), st.floats(-500, 500))
def test_the_units_of_a_series_do_not_move_its_steps(values: list[float], scale: float,
                                                    shift: float) -> None:
    """Images/s or ms per step, any scale or offset: the same nights step."""
    found = [cp.index for cp in detect(values)]
    assert [cp.index for cp in detect([v * scale + shift for v in values])] == found


def night(index: int, value: float, action: str | None = None) -> Point:
    when = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=index)
    return Point(index + 1, when, f"{index:07x}" + "0" * 33, "main", "runner", "pass",
                 [[value]], action)


def test_the_newest_step_for_the_worse_blocks_until_a_run_records_the_baseline() -> None:
    rng = random.Random(1)
    values = noisy(100, 20, rng) + noisy(90, 3, rng)
    points = [night(i, v) for i, v in enumerate(values)]
    (step,) = steps(points, "samples_per_s", "images/s", True)
    assert step.worse and not step.accepted and step.runs_since == 3
    assert blocking([step]) is step
    text = step.describe()
    assert re.match(r"images/s dropped (9|10)\.\d% \((99|100)\.\d\d -> (89|9\d)\.\d\d, p=\S+\) ",
                    text), text
    assert "at commit 0000014 (run 21, night of 2026-11-21); the run before: commit 0000013" in text
    # a later run that recorded the baseline accepts the new level
    points[-1] = night(22, values[-1], "recorded")
    (accepted,) = steps(points, "samples_per_s", "images/s", True)
    assert accepted.accepted and blocking([accepted]) is None
    # a run that only added launches to the baseline, or kept it, does not
    for action in ("added", "kept"):
        points[-1] = night(22, values[-1], action)
        assert blocking(steps(points, "samples_per_s", "images/s", True)) is not None


def test_a_fix_after_the_regression_unblocks_and_memory_is_worse_upwards() -> None:
    rng = random.Random(2)
    values = noisy(100, 20, rng) + noisy(80, 6, rng) + noisy(100, 4, rng)
    points = [night(i, v) for i, v in enumerate(values)]
    found = steps(points, "samples_per_s", "images/s", True)
    assert [s.worse for s in found] == [True, False] and blocking(found) is None
    memory = steps([night(i, v) for i, v in enumerate(noisy(1e9, 20, rng) + noisy(1.2e9, 3, rng))],
                   "peak_memory_bytes", "bytes", False)
    assert [s.worse for s in memory] == [True] and blocking(memory) is memory[0]
    assert re.match(r"peak memory rose (19|20|21)\.\d% \(9\d\d\.\d\d MiB -> 1\.\d\d GiB, ",
                    memory[0].describe())


def test_a_step_smaller_than_the_minimum_is_reported_but_does_not_block() -> None:
    """Peak memory is steady enough for a 1.5% rise to be significant: a step, not a failure
    under a 10% minimum (the memory tolerance); the same step blocks with no minimum."""
    rng = random.Random(9)
    values = noisy(1e9, 10, rng, cv=0.0005) + noisy(1.015e9, 3, rng, cv=0.0005)
    found = steps([night(i, v) for i, v in enumerate(values)], "peak_memory_bytes", "bytes",
                  False)
    assert [s.worse for s in found] == [True]
    assert blocking(found, 0.10) is None and blocking(found) is found[0]


@pytest.mark.usefixtures("subprocess_env")
def test_the_gate_fails_tonight_after_a_step_down_and_a_recorded_baseline_accepts_it(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Night 1 runs for real; eight older nights at ten times its speed go in before it; night 2
    (as slow as night 1) fails on the step, whatever its single-run verdict; a run with
    --dlperf-update-baselines accepts the level, and the night after passes."""
    pytester.makepyfile(test_h=ONE, numpy_mlp_adapter=ADAPTER)
    store_path = tmp_path / "history.db"
    history = f"--dlperf-history={store_path}"

    def run(*extra: str, night_no: int) -> tuple[pytest.RunResult, dict]:
        # 50 steps a window: the MLP's step is tens of microseconds, and 2-step windows on a
        # busy machine came out 150x apart
        result = pytester.runpytest_subprocess(*RUN, "--dlperf-steps", "50", history,
                                               "--dlperf-json", f"{night_no}.json", *extra,
                                               timeout=300)
        (bench,) = json.loads((pytester.path / f"{night_no}.json").read_text())["benchmarks"]
        return result, bench["extra_info"]

    first, info = run(night_no=1)
    first.assert_outcomes(passed=1)
    assert info["history"] == {"runs": 1, "steps": [], "blocking": None}
    store = History.open(str(store_path))
    (key,) = store.keys()
    (real,) = store.series(key["case_key"], key["fingerprint_id"])
    case = {k: key[k] for k in ("case_key", "fingerprint_id", "fingerprint", "framework",
                                "model", "unit")}
    for i in range(8):  # the nights before: ten times as fast, 1% apart (a margin that two
        fast = 10 * real.median * (1 + 0.01 * (-1) ** i)  # busy cores cannot close)
        store.append({"started_at": real.started_at - dt.timedelta(days=9 - i),
                      "commit_id": "a" * 40, "branch": "main", "dirty": False, "host": "runner",
                      "machine": "box", "plugin_version": "0", "protocol": {}},
                     [{**case, "verdict": "pass", "metrics": {"samples_per_s": [[fast]]}}])

    second, info = run(night_no=2)
    second.assert_outcomes(failed=1)
    night_1 = real.started_at.date().isoformat()
    second.stdout.fnmatch_lines([
        "*pytest-dlperf: CHANGE POINT in *test_h.py::test_one: samples/s dropped *% "
        f"(*, p=*) at no commit recorded (run 1, night of {night_1}); the run before: commit "
        "aaaaaaa. The history has 10 runs of this case and fingerprint, the last 2 (this one "
        "included) after the step, and none of them recorded the baseline*"])
    (step,) = [s for s in info["history"]["steps"] if s["metric"] == "samples_per_s"]
    assert info["history"]["runs"] == 10 and step["worse"] and not step["accepted"]
    assert step["change"] == pytest.approx(-0.9, abs=0.06) and step["runs_since"] == 2
    assert "throughput step -" in info["verdict"]["text"]

    accept, info = run("--dlperf-update-baselines", night_no=3)
    accept.assert_outcomes(passed=1)
    after, info = run(night_no=4)
    after.assert_outcomes(passed=1)
    assert info["history"]["runs"] == 12 and info["history"]["blocking"] is None
    # the step down into night 1 is still there, now accepted
    (step,) = [s for s in info["history"]["steps"]
               if s["metric"] == "samples_per_s" and s["run_id"] == 1]
    assert step["accepted"] and step["worse"]
