"""``dlperf nightly run|accept|status``: the nightly gate, three judges in one night.

A night runs the selected tests twice, each a pytest session of its own:

1. **A/B against the last good commit** (``--dlperf-ab LAST_GOOD --dlperf-ab-mode auto``: duet
   where a case fits in half the machine, turns where it does not): the step a commit makes,
   seen the night it lands, whatever the runner's drift between nights (A/B cancels it); and,
   where it is another commit, **A/B against the anchor** (the commit of night 1 or of the last
   accepted change): a creep of 1% a night passes each night's A/B against yesterday and adds
   up against the anchor, where A/B sees it once it nears the tolerance;
2. **the baselines and the history**, as the gate always judged (``--dlperf-update-baselines
   missing``, ``--dlperf-history``): the creep a night at a time that A/B is blind to.

A night fails when A/B proves a regression, or the baselines or the history do. Inconclusive
is no failure: a night is never failed for lack of evidence (both judges have already taken
their extra launches and pairs). The **last good commit**, the commit of the tests' repository
(and each framework's version) of the last night that passed, is kept in the runner's folder of
the store (``nightly.json``, beside its baselines and history): a failing night leaves it where
it was, a person moves it (``dlperf nightly accept [REV]``). Night 1 has none, says so, and
judges by the baselines alone (recording them).

On an A/B failure, ``--bisect`` runs ``dlperf bisect`` over the range when it holds more than one
commit, and the summary names the first slow commit. The summary (``summary.md``) says which
judge failed the night and each judge's figures.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bisect import classify
from .core import worktrees
from .core.worktrees import GitError

STATE = "nightly.json"
ANCHORED = "A/B since the anchor"  # the judge of a creep
PASSED, FAILED, NOT_JUDGED = "passed", "failed", "not judged"


class NightlyError(Exception):
    """Bad input: what was wrong and what to do."""


# -- the runner's state -----------------------------------------------------------------------

def state_path(folder: Path) -> Path:
    return folder / STATE


def load_state(folder: Path) -> dict[str, Any]:
    path = state_path(folder)
    if not path.exists():
        return {"last_good": None, "nights": []}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise NightlyError(f"{path}: not a nightly state file ({exc}); move it away to start "
                           "again from night 1") from exc
    if not isinstance(data, dict) or "last_good" not in data:
        raise NightlyError(f"{path}: not a nightly state file (no 'last_good'); move it away to "
                           "start again from night 1")
    return data


def save_state(folder: Path, data: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = state_path(folder)
    scratch = path.with_suffix(".json.tmp")
    scratch.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(scratch, path)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# -- what a night runs ------------------------------------------------------------------------

def test_paths(pytest_args: list[str]) -> list[str]:
    """The test paths among pytest's arguments (existing files or folders, with or without a
    ``::`` node part)."""
    return [a for a in pytest_args if not a.startswith("-") and Path(a.split("::")[0]).exists()]


@dataclass
class Night:
    """One night: where it runs, what it runs, what each judge said."""

    top: Path  # the tests' repository
    folder: Path  # the runner's folder of the store: baselines, history, nightly.json
    store: Path
    history: str
    out: Path
    pytest_args: list[str]
    python: str = sys.executable
    bisect: bool = False
    commit: worktrees.Commit | None = None
    judges: dict[str, dict[str, Any]] = field(default_factory=dict)
    bisected: list[str] = field(default_factory=list)
    anchor: str = ""  # the commit a creep is measured from, where tonight A/Bs against it
    rerecord: str = ""  # who accepted a change, where tonight records the baselines anew

    def pytest(self, extra: list[str], results: Path) -> tuple[int, dict[str, Any] | None]:
        """One pytest session from the tests' repository (case ids relative to it, whole)."""
        command = [self.python, "-m", "pytest", *self.pytest_args, "-p", "no:cacheprovider",
                   "--rootdir", str(self.top), "--dlperf-json", str(results), *extra]
        print(f"dlperf nightly: {' '.join(command)}", file=sys.stderr, flush=True)
        done = subprocess.run(command, cwd=self.top)
        data = json.loads(results.read_text()) if results.exists() else None
        return done.returncode, data

    def ab(self, revision: str, judge: str = "A/B", results: str = "ab.json") -> None:
        code, data = self.pytest(["--dlperf-ab", revision, "--dlperf-ab-mode", "auto"],
                                 self.out / results)
        if data is None:
            self.judges[judge] = {"outcome": "error", "lines": [f"pytest exited {code}"]}
            return
        outcome, lines, _ = classify(data)
        self.judges[judge] = {"outcome": outcome, "lines": lines, "against": revision}

    def baselines(self, rerecord: bool = False) -> dict[str, Any] | None:
        """The baselines and history session: records the missing baselines, or (the night
        after a person's accept) every case's anew, which the history takes as accepting the
        steps before it."""
        code, data = self.pytest(["--dlperf-baselines", str(self.store),
                                  f"--dlperf-update-baselines={'all' if rerecord else 'missing'}",
                                  f"--dlperf-history={self.history}"],
                                 self.out / "results.json")
        if data is None:
            self.judges["baselines"] = {"outcome": "error", "lines": [f"pytest exited {code}"]}
            return None
        self.judges["baselines"], self.judges["history"] = judge_baselines(data)
        return data


def judge_baselines(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The baseline and history judges' outcomes and figures from the baseline session."""
    regressed, recorded, lines, steps, step_lines = [], [], [], [], []
    for bench in data.get("benchmarks", []):
        info = bench["extra_info"]
        verdict, case = info["verdict"], info["case"]
        efficiency = info.get("efficiency_verdict") or {}
        memory = info.get("memory_verdict") or {}
        outcome = verdict.get("outcome")
        written = (info.get("baseline_update") or {}).get("action")
        if written == "recorded":
            recorded.append(case)
        if written in ("recorded", "updated", "replaced-unreadable"):
            pass  # recorded tonight (after an accept): what later nights are judged against
        elif "regression" in (outcome, efficiency.get("outcome"), memory.get("outcome")):
            regressed.append(case)
        delta = verdict.get("delta")
        lines.append(f"{case}: {info['samples_per_s']:,.2f} {info.get('unit', 'samples')}/s, "
                     + (f"baseline {verdict['baseline']:,.2f}, delta {delta:+.1%}, "
                        if delta is not None else "")
                     + f"{verdict.get('text', outcome)}")
        history = info.get("history") or {}
        if history.get("blocking") is not None:
            steps.append(case)
            step_lines.append(f"{case}: {history['steps'][history['blocking']]['text']} "
                              f"({history['runs']} nights)")
    busy = [u.get("case", "?") for u in data.get("dlperf_not_judged") or []]
    lines += [f"{case}: not judged, the machine was busy" for case in busy]
    outcome = (FAILED if regressed else NOT_JUDGED if busy and not data.get("benchmarks")
               else PASSED)
    return ({"outcome": outcome, "lines": lines, "regressed": regressed, "recorded": recorded,
             "busy": busy},
            {"outcome": FAILED if steps else PASSED, "lines": step_lines})


def verdict_of(judges: dict[str, dict[str, Any]]) -> str:
    """The night: failed where a judge proved a slowdown; not judged where nothing was."""
    if any(j.get("outcome") in ("slow", FAILED) for j in judges.values()):
        return FAILED
    if any(j.get("outcome") == "error" for j in judges.values()):
        return "error"
    if judges.get("baselines", {}).get("outcome") == NOT_JUDGED and judges.get(
            "A/B", {}).get("outcome") in (None, "machine busy"):
        return NOT_JUDGED
    return PASSED


def framework_versions(data: dict[str, Any] | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for bench in (data or {}).get("benchmarks", []):
        info = bench["extra_info"]
        if info.get("framework") and info.get("framework_version"):
            found[info["framework"]] = info["framework_version"]
    return found


# -- the night, its summary, and a person's word ------------------------------------------------

def summary(night: Night, last_good: dict[str, Any] | None, outcome: str) -> str:
    """The night in Markdown: the outcome and which judge decided it, then each judge."""
    commit = night.commit
    tonight = f"`{commit.short}` {commit.subject}" if commit else "?"
    lines = [f"# Nightly perf gate: {outcome}", "", f"Tonight: {tonight}."]
    if last_good is None:
        lines.append("No last good commit yet (night 1): A/B had nothing to run against; "
                     "tonight judged by the baselines and the history alone.")
    else:
        lines.append(f"Last good commit: `{last_good['commit'][:10]}` ({last_good['how']}, "
                     f"{last_good['at']}).")
        if commit is not None and commit.sha != last_good["commit"]:
            lines.append(f"Commits since: {len(_since(night, last_good['commit']))} "
                         f"(`{last_good['commit'][:10]}..{commit.short}`, first parents).")
    if ANCHORED in night.judges:
        lines.append(f"Anchor: `{night.anchor[:10]}` (night 1 or the last accepted change: what "
                     "a creep is measured from).")
    failed_by = [name for name, judge in night.judges.items()
                 if judge.get("outcome") in (FAILED, "slow")]
    if failed_by:
        lines.append(f"Failed by: {', '.join(failed_by)}.")
    first_slow = [line for line in night.bisected if line.startswith("first slow commit: ")]
    if first_slow:
        sha, _, subject = first_slow[-1].removeprefix("first slow commit: ").partition(" ")
        lines.append(f"First slow commit: `{sha[:10]}` {subject} (bisected below).")
    if night.rerecord:
        lines.append(f"Baselines recorded anew after the change {night.rerecord}: tonight "
                     "records what later nights are judged against.")
    for name, judge in night.judges.items():
        what = {"slow": "regression", "not slow": "pass"}.get(judge["outcome"], judge["outcome"])
        against = f" against `{judge['against'][:10]}`" if judge.get("against") else ""
        lines += ["", f"## {name}{against}: {what}", ""]
        lines += [f"- {line}" for line in judge.get("lines") or ["(nothing to judge)"]]
    if night.bisected:
        lines += ["", "## Bisect", "", *[f"    {line}" for line in night.bisected]]
    recorded = night.judges.get("baselines", {}).get("recorded") or []
    if recorded:
        lines += ["", f"First night for {len(recorded)} case(s) on this runner: their "
                  f"baselines were recorded in `{night.store}` and judge from the next night on."]
    return "\n".join(lines) + "\n"


def _since(night: Night, good: str) -> list[worktrees.Commit]:
    """The first-parent commits after ``good`` up to tonight's (empty where it is not an
    ancestor: a rewritten branch)."""
    assert night.commit is not None
    try:
        return worktrees.first_parent_range(night.top, worktrees.resolve(night.top, good),
                                            night.commit)
    except GitError:
        return []


def run_night(night: Night) -> int:
    """One night: 0 passed (the last good commit moves here), 1 failed, 3 not judged or an
    error (it stays)."""
    try:
        night.commit = worktrees.resolve(night.top, "HEAD")
    except GitError as exc:
        raise NightlyError(f"the tests' folder {night.top} is not a git checkout with a commit "
                           f"({exc}): the nightly keeps the last good commit of their "
                           "repository") from exc
    state = load_state(night.folder)
    last_good, anchor = state.get("last_good"), state.get("anchor")
    night.out.mkdir(parents=True, exist_ok=True)
    if last_good is not None and last_good["commit"] != night.commit.sha:
        night.ab(last_good["commit"])
    elif last_good is not None:
        night.judges["A/B"] = {"outcome": "skipped", "lines": [
            "tonight's commit is the last good one: nothing changed to compare"]}
    # The creep a night at a time that A/B against yesterday passes: A/B against the anchor
    # (the commit night 1 or the last accepted change ran), where it is not the last good one.
    if anchor is not None and anchor["commit"] not in (night.commit.sha,
                                                       (last_good or {}).get("commit")):
        night.anchor = anchor["commit"]
        night.ab(anchor["commit"], ANCHORED, "ab-anchor.json")
    night.rerecord = (state.get("rerecord") or {}).get("how", "")
    data = night.baselines(rerecord=bool(night.rerecord))
    outcome = verdict_of(night.judges)
    if (outcome == FAILED and night.bisect and last_good is not None
            and night.judges.get("A/B", {}).get("outcome") == "slow"):
        _bisect(night, last_good["commit"])
    record = {"commit": night.commit.sha, "at": now(), "outcome": outcome,
              "judges": {k: v["outcome"] for k, v in night.judges.items()}}
    state.setdefault("nights", []).append(record)
    if night.rerecord and outcome != "error":
        del state["rerecord"]  # recorded: from tomorrow the baselines judge again
    if outcome == PASSED:
        state["last_good"] = {"commit": night.commit.sha, "at": record["at"],
                              "how": "the last night that passed",
                              "framework_versions": framework_versions(data)}
        if anchor is None:  # night 1: what later nights' creep is measured from
            state["anchor"] = {**state["last_good"], "how": "night 1"}
    save_state(night.folder, state)
    (night.out / "summary.md").write_text(summary(night, last_good, outcome))
    return {PASSED: 0, FAILED: 1}.get(outcome, 3)


def _bisect(night: Night, good: str) -> None:
    """``dlperf bisect`` over the range, where it holds more than one commit."""
    assert night.commit is not None
    commits = _since(night, good)
    if len(commits) < 2:
        night.bisected = [f"the range holds one commit: {night.commit.short} "
                          f"{night.commit.subject}"]
        return
    done = subprocess.run([night.python, "-m", "pytest_dlperf", "bisect", good,
                           night.commit.sha, "--", *night.pytest_args,
                           "--dlperf-ab-mode", "auto"],  # A/B's mode as the night's
                          cwd=night.top, capture_output=True, text=True)
    night.bisected = done.stdout.strip().splitlines()[-12:] or [f"bisect exited "
                                                                f"{done.returncode}"]


def accept(folder: Path, top: Path, revision: str, who: str) -> str:
    """A person moves the last good commit (a change that costs time on purpose)."""
    commit = worktrees.resolve(top, revision)
    state = load_state(folder)
    state["last_good"] = {"commit": commit.sha, "at": now(), "how": f"accepted by {who}",
                          "framework_versions": {}}
    state["anchor"] = dict(state["last_good"])  # the creep is measured from here on
    # The next night records the runner's baselines anew: the faster code's would fail the
    # accepted change, and the history's step down with them.
    state["rerecord"] = {"how": f"accepted by {who}", "at": state["last_good"]["at"]}
    save_state(folder, state)
    return f"last good commit: {commit.short} {commit.subject} (accepted by {who})"


# -- the command -----------------------------------------------------------------------------

def _absolute(path: str) -> str:
    """A test path (``file::node`` too) made absolute: the sessions run from the tests' top."""
    file, sep, node = path.partition("::")
    return str(Path(file).resolve()) + sep + node


def machine_name() -> str:
    """The runner's name (``DLPERF_MACHINE``, else ``RUNNER_NAME``, else the host's), as a
    baseline folder's name."""
    name = os.environ.get("DLPERF_MACHINE") or os.environ.get("RUNNER_NAME") or os.uname()[1]
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:64]


def default_store() -> Path:
    if os.environ.get("DLPERF_NIGHTLY_STORE"):
        return Path(os.environ["DLPERF_NIGHTLY_STORE"])
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "pytest-dlperf" / "nightly"


def tests_top(pytest_args: list[str]) -> Path:
    """The repository of the first test path (its last good commit is the nightly's)."""
    paths = test_paths(pytest_args)
    if not paths:
        raise NightlyError("no test path among pytest's arguments: name your tests "
                           "(dlperf nightly run -- tests/perf -k 1n1d)")
    first = Path(paths[0].split("::")[0]).resolve()
    try:
        return worktrees.toplevel(first if first.is_dir() else first.parent)
    except GitError as exc:
        raise NightlyError(f"{paths[0]} is not in a git checkout: the nightly compares tonight's "
                           "commit of the tests' repository with the last good one") from exc


def main(action: str, pytest_args: list[str], *, revision: str = "HEAD", bisect: bool = False,
         who: str | None = None) -> int:
    """``dlperf nightly ACTION``; the exit status (2: bad input)."""
    store = default_store()
    folder = store / machine_name()
    try:
        if action == "status":
            state = load_state(folder)
            print(json.dumps(state.get("last_good"), indent=2))
            return 0
        top = tests_top(pytest_args) if pytest_args else worktrees.toplevel(Path.cwd())
        if action == "accept":
            print(accept(folder, top, revision, who or os.environ.get("USER", "a person")))
            return 0
        os.environ["DLPERF_MACHINE"] = machine_name()
        paths = set(test_paths(pytest_args))
        args = [_absolute(a) if a in paths else a for a in pytest_args]
        night = Night(top=top, folder=folder, store=store,
                      history=os.environ.get("DLPERF_NIGHTLY_HISTORY")
                      or str(folder / "history.db"),
                      out=Path(os.environ.get("DLPERF_NIGHTLY_OUT", "nightly-results")).resolve(),
                      pytest_args=args, bisect=bisect)
        return run_night(night)
    except (NightlyError, GitError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
