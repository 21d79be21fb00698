"""scripts/nightly, as the nightly workflow runs it, on a team's own tests (issue 53): real nights
on this machine, in a git repository of the README's MLP outside the clone. Night 1 records the
runner's baselines and passes; an unchanged night 2 (a commit that touches no model) passes, A/B
against night 1's commit; night 3's two commits make the model ~6x slower (the first of them) and
fail by A/B (against night 2's commit, and against night 1's, the anchor), naming the range and,
bisected, the first slow commit, and leave the last good commit where it was; a person's accept
moves it and the anchor, and night 4 on the accepted commit passes, recording the runner's
baselines anew (the history takes the step as accepted). Every night goes into the runner's
history. The committed baselines play no part."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from numpy_mlp import FAST, SLOW
from test_ab import commit_model, git

from pytest_dlperf import nightly

pytestmark = pytest.mark.alone("the nightly's gate judges timings it recorded minutes earlier")

REPO = Path(__file__).resolve().parents[1]
# A short protocol (its own fingerprint): what is tested is the gate's flow. Windows of 100 steps
# after 50 warm-up steps, as tests/test_ab.py's A/B runs take them; rounds of 3 pairs up to 6:
# in duet three pairs leave the t-test one degree of freedom (each half's speed is taken out),
# so a ~5x change is proven at the second round (with 3 at most, A/B went on to 12 pairs, the
# bisect probe too: ~2 minutes more here).
CASE = ["-k", "1n1d and fp32", "--dlperf-protocol", "quick", "--dlperf-steps", "100",
        "--dlperf-warmup-steps", "50", "--dlperf-repeats", "3", "--dlperf-launches", "3",
        "--dlperf-max-repeats", "6", "--dlperf-phases", "off",
        # one-step-per-window noise on a shared CPU: night one may not refuse its baseline
        "--dlperf-unstable-cv", "10"]


def night(tmp_path: Path, tests: Path, *extra: str, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}, **(env or {})}
    env.update(DLPERF_NIGHTLY_STORE=str(tmp_path / "runner-store"), DLPERF_MACHINE="runner",
               DLPERF_NIGHTLY_OUT=str(tmp_path / "out"), DLPERF_NIGHTLY_PYTHON=sys.executable,
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    return subprocess.run([str(REPO / "scripts" / "nightly"), str(tests), *CASE, *extra],
                          capture_output=True, text=True, env=env, timeout=900,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)


def last_good(tmp_path: Path, which: str = "last_good") -> str | None:
    state = json.loads((tmp_path / "runner-store" / "runner" / "nightly.json").read_text())
    return state[which]["commit"] if state.get(which) else None


@pytest.mark.outside_ci(
    "191 s alone, CI's 35 minutes (issue 54): its judges "
    "(test_judges_make_the_night), A/B's slower commit and the bisect of a range "
    "(test_ab) run in CI")
def test_nights_judge_by_ab_against_the_last_good_commit_then_by_the_baselines(
        tmp_path: Path) -> None:
    repo = tmp_path / "mymodel"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("*.json\n")
    first = commit_model(repo, FAST, "the MLP")
    tests = repo / "test_my_model.py"

    one = night(tmp_path, tests)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("# Nightly perf gate: passed")
    assert "No last good commit yet (night 1)" in summary and "First night for 1 case(s)" in summary
    assert last_good(tmp_path) == last_good(tmp_path, "anchor") == first
    # The case id keeps its file (the test file is outside the clone: its repository is the
    # rootdir), in the results and in the baseline's folder.
    (bench,) = json.loads((tmp_path / "out" / "results.json").read_text())["benchmarks"]
    assert bench["name"] == "test_mlp[1n1d-fp32]" and bench["fullname"].startswith(
        "test_my_model.py::")
    (stored,) = (tmp_path / "runner-store" / "runner").rglob("test_mlp-1n1d-fp32/*.json")
    assert stored.parent.parent.name == "test_my_model"

    second = commit_model(repo, FAST, "an unrelated change")
    two = night(tmp_path, tests)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert f"## A/B against `{first[:10]}`: " in summary
    ab = json.loads((tmp_path / "out" / "ab.json").read_text())["benchmarks"][0]["extra_info"]
    assert ab["ab"]["mode"] == "duet" and ab["ab"]["mode_asked"] == "auto"  # 1n1d: half fits
    assert ab["ab"]["outcome"] in ("pass", "inconclusive", "improvement")
    assert last_good(tmp_path) == second

    third = commit_model(repo, SLOW, "a wider hidden layer")
    fourth = commit_model(repo, SLOW, "a comment")
    three = night(tmp_path, tests, env={"DLPERF_NIGHTLY_BISECT": "1"})
    assert three.returncode == 1, three.stdout[-3000:] + three.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("# Nightly perf gate: failed")
    assert f"Tonight: `{fourth[:10]}` a comment." in summary
    assert f"Commits since: 2 (`{second[:10]}..{fourth[:10]}`, first parents)." in summary
    assert "Failed by: A/B" in summary
    # The range holds two commits: bisected (each probe the probe commit's own test file), the
    # first slow one is named.
    assert f"First slow commit: `{third[:10]}` a wider hidden layer" in summary, summary
    assert f"## A/B against `{second[:10]}`: regression" in summary
    # ... and against the anchor (night 1's commit): a creep adds up there
    assert f"## A/B since the anchor against `{first[:10]}`: regression" in summary
    assert "test_my_model.py::test_mlp[1n1d-fp32]: head/base 0." in summary
    assert last_good(tmp_path) == second  # a failed night does not move it

    accepted = subprocess.run([sys.executable, "-m", "pytest_dlperf", "nightly", "accept",
                               "--by", "a reviewer"], cwd=repo, capture_output=True, text=True,
                              env={**os.environ, "DLPERF_NIGHTLY_STORE":
                                   str(tmp_path / "runner-store"), "DLPERF_MACHINE": "runner"})
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.startswith(f"last good commit: {fourth[:10]} a comment")
    assert last_good(tmp_path) == last_good(tmp_path, "anchor") == fourth
    state = json.loads((tmp_path / "runner-store" / "runner" / "nightly.json").read_text())
    assert state["last_good"]["how"] == "accepted by a reviewer"
    assert [n["outcome"] for n in state["nights"]] == ["passed", "passed", "failed"]

    # Night 4, the accepted (slower) commit again: nothing to A/B; the runner's baselines of the
    # faster code would fail it, and the history's step down too, so they are recorded anew.
    four = night(tmp_path, tests)
    assert four.returncode == 0, four.stdout[-3000:] + four.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("# Nightly perf gate: passed"), summary
    assert "Baselines recorded anew after the change accepted by a reviewer" in summary, summary
    (bench,) = json.loads((tmp_path / "out" / "results.json").read_text())["benchmarks"]
    assert bench["extra_info"]["baseline_update"]["action"] == "updated"
    state = json.loads((tmp_path / "runner-store" / "runner" / "nightly.json").read_text())
    assert [n["outcome"] for n in state["nights"]] == ["passed", "passed", "failed", "passed"]
    assert "rerecord" not in state  # once, the night after the accept

    # Every night is in the runner's history, beside its baselines.
    from pytest_dlperf.store.history import History

    history = History.open(str(tmp_path / "runner-store" / "runner" / "history.db"))
    (key,) = history.keys()
    assert key["runs"] == 4 and key["case_key"] == "test_my_model.py::test_mlp[1n1d-fp32]"


def test_judges_make_the_night() -> None:
    """Which judge fails a night, and what is no failure: inconclusive, a busy machine."""
    regressed = {"benchmarks": [{"extra_info": {
        "case": "t.py::t[1n1d]", "samples_per_s": 90.0, "unit": "samples",
        "verdict": {"outcome": "regression", "delta": -0.1, "baseline": 100.0,
                    "text": "regression"}}}]}
    baselines, history = nightly.judge_baselines(regressed)
    assert baselines["outcome"] == nightly.FAILED and baselines["regressed"] == ["t.py::t[1n1d]"]
    assert baselines["lines"] == ["t.py::t[1n1d]: 90.00 samples/s, baseline 100.00, delta "
                                  "-10.0%, regression"]
    assert nightly.verdict_of({"A/B": {"outcome": "not slow"}, "baselines": baselines,
                               "history": history}) == nightly.FAILED
    # The night after an accept records the baselines anew: measured against the old ones the
    # case reads as a regression, which it is not for the night.
    rerecorded = {"benchmarks": [{"extra_info": {**regressed["benchmarks"][0]["extra_info"],
                                                 "baseline_update": {"action": "updated"}}}]}
    baselines, history = nightly.judge_baselines(rerecorded)
    assert baselines["outcome"] == nightly.PASSED and baselines["regressed"] == []
    unsure = {"benchmarks": [{"extra_info": {**regressed["benchmarks"][0]["extra_info"],
                                             "verdict": {"outcome": "inconclusive",
                                                         "delta": -0.1, "baseline": 100.0,
                                                         "text": "inconclusive"}}}]}
    judged = dict(zip(("baselines", "history"), nightly.judge_baselines(unsure)))
    assert nightly.verdict_of({"A/B": {"outcome": "inconclusive"}, **judged}) == nightly.PASSED
    assert nightly.verdict_of({"A/B": {"outcome": "slow"}, **judged}) == nightly.FAILED
    busy = {"benchmarks": [], "dlperf_not_judged": [{"case": "t.py::t[1n1d]"}]}
    judged = dict(zip(("baselines", "history"), nightly.judge_baselines(busy)))
    assert nightly.verdict_of(judged) == nightly.NOT_JUDGED


def test_a_broken_state_file_is_named(tmp_path: Path) -> None:
    (tmp_path / nightly.STATE).write_text("{not json")
    with pytest.raises(nightly.NightlyError, match=r"nightly\.json: not a nightly state file"):
        nightly.load_state(tmp_path)
    assert nightly.load_state(tmp_path / "new") == {"last_good": None, "nights": []}
