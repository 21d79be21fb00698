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
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from numpy_mlp import ADAPTER, FAST, SLOW, model
from test_ab import commit, commit_model, git

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
        "--dlperf-unstable-cv", "10",
        # The nights' changes are 2x or more, and an unchanged night must be judged a pass: at
        # 5% neither judge could (CI, 2026-12-07: A/B 0.972 [0.905, 1.045] in 6 duet pairs of
        # 6.4% cv, the baselines -5.0% against one run's, so "not judged").
        "--dlperf-tolerance", "15%"]
# Nights whose change is 2x or more: shorter windows tell it as surely, in less of CI's time.
SHORT = ["--dlperf-steps", "40", "--dlperf-warmup-steps", "10"]


def night(tmp_path: Path, tests: Path, *extra: str, env: dict[str, str] | None = None,
          clone: Path = REPO) -> subprocess.CompletedProcess[str]:
    """One night of ``scripts/nightly`` (``clone``'s) on ``tests``, a runner's store in
    ``tmp_path``."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")},
           "DLPERF_NIGHTLY_PYTHON": sys.executable, **(env or {})}
    env.update(DLPERF_NIGHTLY_STORE=str(tmp_path / "runner-store"), DLPERF_MACHINE="runner",
               DLPERF_NIGHTLY_OUT=str(tmp_path / "out"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    return subprocess.run([str(clone / "scripts" / "nightly"), str(tests), *CASE, *extra],
                          capture_output=True, text=True, env=env, timeout=900,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)


def team_repository(tmp_path: Path) -> tuple[Path, str, Path]:
    """A team's repository of the README's MLP (its adapter beside it): the folder, its first
    commit, its test file."""
    repo = tmp_path / "mymodel"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("*.json\n")
    first = commit_model(repo, FAST, "the MLP")
    return repo, first, repo / "test_my_model.py"


def last_good(tmp_path: Path, which: str = "last_good") -> str | None:
    state = json.loads((tmp_path / "runner-store" / "runner" / "nightly.json").read_text())
    return state[which]["commit"] if state.get(which) else None


def test_nights_judge_by_ab_against_the_last_good_commit_then_by_the_baselines(
        tmp_path: Path) -> None:
    repo, first, tests = team_repository(tmp_path)

    one = night(tmp_path, tests)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("# Nightly perf gate: passed")
    assert "No last good night yet (night 1)" in summary and "First night for 1 case(s)" in summary
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
    assert f"## A/B against commit `{first[:10]}`: " in summary
    ab = json.loads((tmp_path / "out" / "ab.json").read_text())["benchmarks"][0]["extra_info"]
    assert ab["ab"]["mode"] == "duet" and ab["ab"]["mode_asked"] == "auto"  # 1n1d: half fits
    assert ab["ab"]["outcome"] in ("pass", "inconclusive", "improvement")
    assert last_good(tmp_path) == second

    third = commit_model(repo, SLOW, "a wider hidden layer")
    fourth = commit_model(repo, SLOW, "a comment")
    # A 5x slower model: shorter windows (a protocol, so a history key, of their own) tell it
    # as surely, A/B and the bisect's probes (this test: 92 s with the others' windows, 68-80 s
    # with these, quiet here 2026-12-06).
    three = night(tmp_path, tests, *SHORT, env={"DLPERF_NIGHTLY_BISECT": "1"})
    assert three.returncode == 1, three.stdout[-3000:] + three.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("# Nightly perf gate: failed")
    assert f"Tonight: `{fourth[:10]}` a comment." in summary
    assert f"Commits since: 2 (`{second[:10]}..{fourth[:10]}`, first parents)." in summary
    assert "Failed by: A/B" in summary
    # The range holds two commits: bisected (each probe the probe commit's own test file), the
    # first slow one is named.
    assert f"First slow commit: `{third[:10]}` a wider hidden layer" in summary, summary
    assert f"## A/B against commit `{second[:10]}`: regression" in summary
    # ... and against the anchor (night 1's commit): a creep adds up there
    assert f"## A/B since the anchor against commit `{first[:10]}`: regression" in summary
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

    # Every night is in the runner's history, beside its baselines: nights 1, 2 and 4 under
    # one protocol, night 3 under its shorter one.
    from pytest_dlperf.store.history import History

    history = History.open(str(tmp_path / "runner-store" / "runner" / "history.db"))
    keys = history.keys()
    assert sorted(key["runs"] for key in keys) == [1, 3], keys
    assert {key["case_key"] for key in keys} == {"test_my_model.py::test_mlp[1n1d-fp32]"}


def bench(case: str = "t.py::t[1n1d]", outcome: str = "pass", **extra: object
          ) -> dict[str, object]:
    """A baseline session's case as its results file holds it."""
    return {"extra_info": {"case": case, "samples_per_s": 90.0, "unit": "samples",
                           "verdict": {"outcome": outcome, "delta": -0.1, "baseline": 100.0,
                                       "text": extra.pop("text", outcome)}, **extra}}


def ab_bench(case: str, outcome: str) -> dict[str, object]:
    return {"extra_info": {"case": case, "ab": {"outcome": outcome, "ratio": 0.99,
                                                "ratio_ci": [0.95, 1.03], "pairs": [{}] * 3}}}


def test_judges_make_the_night() -> None:
    """Which judge fails a night, and what is no failure: inconclusive, a busy machine."""
    regressed = {"benchmarks": [bench(outcome="regression")]}
    baselines, history = nightly.judge_baselines(regressed, 1)
    assert baselines["outcome"] == nightly.FAILED and baselines["regressed"] == ["t.py::t[1n1d]"]
    assert baselines["lines"] == ["t.py::t[1n1d]: 90.00 samples/s, baseline 100.00, delta "
                                  "-10.0%, regression"]
    assert nightly.verdict_of({"A/B": {"outcome": "not slow"}, "baselines": baselines,
                               "history": history})[0] == nightly.FAILED
    # The night after an accept records the baselines anew: measured against the old ones the
    # case reads as a regression, which it is not for the night.
    rerecorded = {"benchmarks": [bench(outcome="regression",
                                       baseline_update={"action": "updated"})]}
    baselines, history = nightly.judge_baselines(rerecorded)
    assert baselines["outcome"] == "recorded" and baselines["regressed"] == []
    assert nightly.verdict_of({"baselines": baselines, "history": history}) == (
        nightly.PASSED, [])
    unsure = dict(zip(("baselines", "history"), nightly.judge_baselines(
        {"benchmarks": [bench(outcome="inconclusive")]})))
    ab_slow = nightly.judge_ab({"benchmarks": [ab_bench("t.py::t[1n1d]", "regression")]}, 1,
                               "x")
    assert nightly.verdict_of({"A/B": ab_slow, **unsure})[0] == nightly.FAILED
    # A/B passed the case: the baselines' inconclusive verdict is no failure
    ab_pass = nightly.judge_ab({"benchmarks": [ab_bench("t.py::t[1n1d]", "pass")]}, 0, "x")
    assert nightly.verdict_of({"A/B": ab_pass, **unsure}) == (nightly.PASSED, [])


def test_a_night_passes_only_on_a_judgement() -> None:
    """Issue 73: a night no judge could judge is not judged (and moves nothing); so is one whose
    run failed or recorded nothing. Each of these passed before."""
    skipped = {"outcome": "skipped", "lines": ["nothing changed"]}
    # A/B skipped (nothing changed), the baselines inconclusive, the history nothing to judge
    unsure = dict(zip(("baselines", "history"), nightly.judge_baselines(
        {"benchmarks": [bench(outcome="inconclusive"), bench("t.py::u", "pass")]})))
    assert nightly.verdict_of({"A/B": skipped, **unsure}) == (nightly.NOT_JUDGED,
                                                              ["t.py::t[1n1d]"])
    # ... the baselines not judged, the machine busy
    busy = dict(zip(("baselines", "history"), nightly.judge_baselines(
        {"benchmarks": [], "dlperf_not_judged": [{"case": "t.py::t[1n1d]"}]})))
    assert busy["baselines"]["outcome"] == nightly.NOT_JUDGED
    assert nightly.verdict_of({"A/B": skipped, **busy}) == (nightly.NOT_JUDGED,
                                                            ["t.py::t[1n1d]"])
    # A/B beside a busy machine too
    ab_busy = nightly.judge_ab({"benchmarks": [], "dlperf_not_judged": [
        {"case": "t.py::t[1n1d]", "outcome": "machine-busy"}]}, 0, "x")
    assert nightly.verdict_of({"A/B": ab_busy, **busy})[0] == nightly.NOT_JUDGED
    # night 1 whose recording was refused as unstable (its test failed: pytest exited 1)
    refused = {"benchmarks": [bench(outcome="no-baseline",
                                    text="not recorded (unstable)")]}
    judged = dict(zip(("baselines", "history"), nightly.judge_baselines(refused, 1)))
    assert judged["baselines"]["outcome"] == nightly.NOT_JUDGED
    assert nightly.verdict_of(judged) == (nightly.NOT_JUDGED, ["t.py::t[1n1d]"])
    # a session that failed a case otherwise, one that ran nothing, one that wrote no results
    failed = dict(zip(("baselines", "history"), nightly.judge_baselines(
        {"benchmarks": [bench()]}, 1)))
    assert nightly.verdict_of(failed)[0] == nightly.NOT_JUDGED
    assert nightly.verdict_of(dict(zip(("baselines", "history"), nightly.judge_baselines(
        {"benchmarks": []}, 5))))[0] == "error"
    assert nightly.verdict_of(dict(zip(("baselines", "history"), nightly.judge_baselines(
        None, 2))))[0] == "error"
    # what still passes: every case passed by a judge or recorded tonight
    recorded = {"benchmarks": [bench(outcome="no-baseline",
                                     baseline_update={"action": "recorded"}),
                               bench("t.py::u", "pass")]}
    judged = dict(zip(("baselines", "history"), nightly.judge_baselines(recorded)))
    assert nightly.verdict_of(judged) == (nightly.PASSED, [])
    # ... a recording covers a case new since the last good night, not one it had: recorded
    # anew, its fingerprint changed (a framework upgraded), and nothing judged the change
    assert nightly.verdict_of(judged, known={"t.py::u"}) == (nightly.PASSED, [])
    assert nightly.verdict_of(judged, known={"t.py::t[1n1d]", "t.py::u"}) == (
        nightly.NOT_JUDGED, ["t.py::t[1n1d]"])


def test_an_accept_before_the_first_night_of_a_runner_then_a_night(tmp_path: Path) -> None:
    """An accept where no night ran yet keeps no environment; the next night's record must
    not trip on it (it did: every later night ended in an AttributeError)."""
    from pytest_dlperf.core import worktrees
    from pytest_dlperf.nightly.night import _record

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    head = commit(repo, "one")
    folder = tmp_path / "runner"
    assert nightly.accept(folder, repo, "HEAD", "me").startswith("last good commit: ")
    state = nightly.load_state(folder)
    assert state["last_good"]["environment"] is None
    kept = folder / "envs" / "abc"
    kept.mkdir(parents=True)
    night = nightly.Night(top=repo, folder=folder, store=tmp_path / "store", history="h.db",
                          out=tmp_path / "out", pytest_args=[],
                          commit=worktrees.resolve(repo, "HEAD"),
                          environment={"digest": "abc"})
    _record(night, state, {"commit": head, "environment": night.environment},
            nightly.NOT_JUDGED, None)
    assert state["last_night"]["environment"]["digest"] == "abc" and kept.exists()


def test_a_broken_state_file_is_named(tmp_path: Path) -> None:
    (tmp_path / nightly.STATE).write_text("{not json")
    with pytest.raises(nightly.NightlyError, match=r"nightly\.json: not a nightly state file"):
        nightly.load_state(tmp_path)
    assert nightly.load_state(tmp_path / "new") == {"last_good": None, "nights": []}


# A package that makes a framework op (NumPy's matmul, which the team's adapter calls) compute
# twice, through a .pth file run at every interpreter's start: a slower framework build
# installed between two nights, no commit.
SLOW_PACKAGE = {
    "pyproject.toml": ('[build-system]\nrequires = ["hatchling"]\n'
                       'build-backend = "hatchling.build"\n[project]\nname = "slowmatmul"\n'
                       'version = "0.1"\n[tool.hatch.build.targets.wheel]\n'
                       'packages = ["slowmatmul"]\n'
                       '[tool.hatch.build.targets.wheel.force-include]\n'
                       '"slowmatmul.pth" = "slowmatmul.pth"\n'),
    "slowmatmul.pth": "import slowmatmul; slowmatmul.install()\n",
    "slowmatmul/__init__.py": ('def install():\n    import numpy\n    fast = numpy.matmul\n\n'
                               '    def twice(*args, **kwargs):\n        fast(*args, **kwargs)\n'
                               '        return fast(*args, **kwargs)\n\n'
                               '    numpy.matmul = twice\n'),
}


def summary_of(tmp_path: Path) -> str:
    return (tmp_path / "out" / "summary.md").read_text()


def test_a_busy_night_is_not_judged_and_an_upgrade_fails_by_ab_against_the_kept_environment(
        tmp_path: Path) -> None:
    """Issue 73: a team's nightly, where what changes between nights is the environment. Night
    1 records and keeps its environment; night 2, unchanged beside two CPU hogs, is judged by
    no one (A/B has nothing to compare, the baselines call the machine busy): not judged,
    nothing moves; night 3, a package that slows NumPy's matmul installed with no commit, fails
    by A/B against night 1's kept environment, naming the package."""
    from pytest_dlperf.core import overlay

    env = overlay.make(sys.executable, tmp_path / "team-env", "true", tmp_path).python
    repo, first, tests = team_repository(tmp_path)
    team = {"DLPERF_NIGHTLY_PYTHON": env}

    one = night(tmp_path, tests, *SHORT, env=team)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    state = json.loads((tmp_path / "runner-store" / "runner" / "nightly.json").read_text())
    kept = state["last_good"]["environment"]
    assert Path(kept["python"]).exists() and kept["lock"]["packages"]["numpy"]
    at = state["last_good"]["at"]

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        two = night(tmp_path, tests, *SHORT, "--dlperf-busy-threshold", "25%", env=team)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert two.returncode == 3, two.stdout[-3000:] + two.stderr[-3000:]
    summary = summary_of(tmp_path)
    assert summary.startswith("# Nightly perf gate: not judged"), summary
    assert "Not judged for 1 case(s): test_my_model.py::test_mlp[1n1d-fp32]" in summary
    assert "## A/B: skipped" in summary and "the machine was busy" in summary
    state = json.loads((tmp_path / "runner-store" / "runner" / "nightly.json").read_text())
    assert state["last_good"]["at"] == at and state["last_good"]["commit"] == first

    slow = tmp_path / "slowmatmul"
    for name, text in SLOW_PACKAGE.items():
        (slow / name).parent.mkdir(parents=True, exist_ok=True)
        (slow / name).write_text(text)
    subprocess.run([sys.executable, "-m", "pip", "--python", env, "install", "-q", "--no-deps",
                    "--no-build-isolation", str(slow)], check=True, capture_output=True)
    three = night(tmp_path, tests, *SHORT, env=team)
    assert three.returncode == 1, three.stdout[-3000:] + three.stderr[-3000:]
    summary = summary_of(tmp_path)
    assert summary.startswith("# Nightly perf gate: failed"), summary
    assert "Environment: 2 change(s) since the last good night: slowmatmul 0.1: added; " \
           "slowmatmul.pth (a .pth file, run at every start): added." in summary, summary
    assert f"## A/B against environment `{kept['digest']}`: regression" in summary, summary
    assert "Failed by: A/B" in summary
    ab = json.loads((tmp_path / "out" / "ab.json").read_text())["benchmarks"][0]["extra_info"]
    assert ab["ab"]["base_python"] == kept["python"] and ab["ab"]["ratio"] < 0.8
    state = json.loads((tmp_path / "runner-store" / "runner" / "nightly.json").read_text())
    assert state["last_good"]["at"] == at  # a failed night moves nothing
    # the store goes into the artifact without the kept environments (whole environments)
    assert (tmp_path / "out" / "baselines" / "runner" / "nightly.json").exists()
    assert not (tmp_path / "out" / "baselines" / "runner" / "envs").exists()
    assert [n["outcome"] for n in state["nights"]] == ["passed", "not judged", "failed"]


def copy_of_this_checkout(dest: Path) -> Path:
    """This checkout's files as they are (committed or not, the ignored left out) as a
    repository of its own: what a clone of this commit would hold."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard",
                             "-z"], capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    git(dest, "init", "-q")
    # (its bytecode, once: where PYTHONDONTWRITEBYTECODE is set, as on this project's machines,
    # every process of every night would compile the plugin again)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest / "pytest_dlperf")],
                   check=True)
    return dest


def test_this_plugins_own_nightly_fails_a_commit_that_runs_the_trainers_step_twice(
        tmp_path: Path) -> None:
    """Issue 73: this repository's own nightly, where the built-in trainers are the plugin's
    rank side: the base side's ranks run the base commit's. A copy of this checkout as a
    repository with a perf test in it; night 1 records; a commit that makes the trainers' step
    run twice (``frameworks.step_phases``: torch's eager step is built from it, and so is this
    adapter's) fails night 2 by A/B, and the header says where the base's rank side came from."""
    repo = copy_of_this_checkout(tmp_path / "pytest-dlperf")
    perf = repo / "nightly_perf"
    perf.mkdir()
    (perf / "numpy_mlp_adapter.py").write_text(ADAPTER)
    (perf / "test_my_model.py").write_text(model(FAST))
    first = commit(repo, "this plugin, with a perf test of its own")
    # the copy's plugin, not the installed one (whose editable finder names this checkout),
    # in an environment of the runner's own (the nightly keeps a copy of it each night)
    from pytest_dlperf.core import overlay

    env = overlay.make(sys.executable, tmp_path / "runner-env", "true", tmp_path).python
    mine = {"PYTHONPATH": str(repo), "DLPERF_NIGHTLY_PYTHON": env}
    one = night(tmp_path, perf / "test_my_model.py", *SHORT, env=mine, clone=repo)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]

    source = repo / "pytest_dlperf" / "frameworks" / "__init__.py"
    text = source.read_text()
    once = "    return [(DATA, data), (FORWARD, forward_phase), (BACKWARD, backward_phase),\n" \
           "            (OPTIMIZER, update)]\n"
    assert once in text, "frameworks.step_phases changed: update this test"
    source.write_text(text.replace(once, once.replace("update)]", "update)] * 2")))
    slow = commit(repo, "the trainers' step, twice")
    two = night(tmp_path, perf / "test_my_model.py", *SHORT, env=mine, clone=repo)
    assert two.returncode == 1, two.stdout[-3000:] + two.stderr[-3000:]
    summary = summary_of(tmp_path)
    assert summary.startswith("# Nightly perf gate: failed"), summary
    assert f"## A/B against commit `{first[:10]}`: regression" in summary, summary
    (bench,) = json.loads((tmp_path / "out" / "ab.json").read_text())["benchmarks"]
    code = bench["extra_info"]["ab"]["code"]
    assert "pytest-dlperf's rank side: pytest_dlperf" in code["base"]["taken"], code
    assert code["base"]["tree"].endswith(first) and bench["extra_info"]["ab"]["ratio"] < 0.8
    # (the ranks imported the worktree's plugin: the check of their imports passed)
    assert bench["extra_info"]["ab"]["head_median"] < bench["extra_info"]["ab"]["base_median"]
    assert git(repo, "rev-parse", "HEAD") == slow
