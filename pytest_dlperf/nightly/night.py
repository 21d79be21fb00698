"""One night: the sessions it runs (A/B against the last good night and the anchor, then the
baselines and the history), what moves where it passes, its summary; and a person's accept."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import worktrees
from ..core.worktrees import GitError
from ..store.nights import KEEP_NIGHTS, add_night
from . import environments as envs
from .judges import (
    FAILED,
    NOT_JUDGED,
    PASSED,
    SKIPPED,
    SLOW,
    judge_ab,
    judge_baselines,
    verdict_of,
)
from .state import NightlyError, load_state, now, save_state

ANCHORED = "A/B since the anchor"  # the judge of a creep


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
    ab_build: str = ""  # --dlperf-ab-build for the A/B sessions and bisect alone
    commit: worktrees.Commit | None = None
    environment: dict[str, Any] | None = None  # tonight's (``environments.keep``'s record)
    judges: dict[str, dict[str, Any]] = field(default_factory=dict)
    unjudged: list[str] = field(default_factory=list)
    bisected: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  # tonight's run added to the baselines
    frameworks: list[str] = field(default_factory=list)  # versions changed since last good
    anchor: str = ""  # the night a creep is measured from, where tonight A/Bs against it
    rerecord: str = ""  # who accepted a change, where tonight records the baselines anew

    def pytest(self, extra: list[str], results: Path) -> tuple[int, dict[str, Any] | None]:
        """One pytest session from the tests' repository (case ids relative to it, whole)."""
        command = [self.python, "-m", "pytest", *self.pytest_args, "-p", "no:cacheprovider",
                   "--rootdir", str(self.top), "--dlperf-json", str(results), *extra]
        print(f"dlperf nightly: {' '.join(command)}", file=sys.stderr, flush=True)
        results.unlink(missing_ok=True)
        done = subprocess.run(command, cwd=self.top)
        data = json.loads(results.read_text()) if results.exists() else None
        return done.returncode, data

    def check(self) -> None:
        """pytest's arguments, collected before anything is written or kept: a usage error
        (pytest's exit 4) or a selection of no test (5) is bad input, said as pytest said it
        (``NightlyError``: exit 2, nothing written). A test file that fails to import is
        tonight's code, not input: the night runs and says so."""
        command = [self.python, "-m", "pytest", *self.pytest_args, "-p", "no:cacheprovider",
                   "--rootdir", str(self.top), "--collect-only", "-q"]
        done = subprocess.run(command, cwd=self.top, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
        if done.returncode not in (4, 5):
            return
        said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        what = "a usage error" if done.returncode == 4 else "they select no test"
        raise NightlyError(f"pytest refused tonight's arguments ({what}, exit "
                           f"{done.returncode}); nothing was run or written:\n  "
                           + "\n  ".join(said[-8:]))

    def ab(self, against: dict[str, Any], judge: str, results: str) -> None:
        """A/B of tonight against a good night: the base side at its commit where tonight's
        differs, under its kept environment where tonight's differs (the packages named)."""
        assert self.commit is not None
        args, said, notes = [], [], []
        if against["commit"] != self.commit.sha:
            args += ["--dlperf-ab", against["commit"]]
            said.append(f"commit `{against['commit'][:10]}`")
        changed = self.changed_since(against)
        python = envs.kept_python(against.get("environment")) if changed else None
        if python is not None:
            args += ["--dlperf-ab-python", python]
            said.append(f"environment `{against['environment']['digest']}`")
        elif changed:
            why = (against.get("environment") or {}).get(
                "why_not_kept", "its kept copy is gone from the store")
            notes.append(f"the environment changed ({len(changed)} package(s)), and that "
                         f"night's is not there to run: {why}; not compared")
        if not args:
            self.judges[judge] = {"outcome": NOT_JUDGED if changed else SKIPPED,
                                  "changed": changed, "lines": notes or [
                "tonight's commit and environment are that night's: nothing changed to "
                "compare"]}
            return
        built = ["--dlperf-ab-build", self.ab_build] if self.ab_build else []
        code, data = self.pytest([*args, "--dlperf-ab-mode", "auto", *built],
                                 self.out / results)
        found = judge_ab(data, code, " and ".join(said))
        self.judges[judge] = {**found, "changed": changed, "lines": [*notes, *found["lines"]]}

    def changed_since(self, night: dict[str, Any]) -> list[str]:
        """The packages that changed from ``night``'s environment to tonight's."""
        then = (night.get("environment") or {}).get("lock")
        if then is None or self.environment is None:
            return []
        return envs.changes(then, self.environment["lock"], self.top)

    def baselines(self, rerecord: bool = False) -> dict[str, Any] | None:
        """The baselines and history session: records the missing baselines, or (the night
        after a person's accept) every case's anew, which the history takes as accepting the
        steps before it."""
        code, data = self.pytest(["--dlperf-baselines", str(self.store),
                                  f"--dlperf-update-baselines={'all' if rerecord else 'missing'}",
                                  f"--dlperf-history={self.history}"],
                                 self.out / "results.json")
        self.judges["baselines"], self.judges["history"] = judge_baselines(data, code)
        return data


def differs(one: dict[str, Any] | None, other: dict[str, Any] | None) -> bool:
    """Whether two nights ran other code: another commit or another environment."""
    if one is None or other is None:
        return one is not other
    digest = [(n.get("environment") or {}).get("digest") for n in (one, other)]
    return one["commit"] != other["commit"] or (None not in digest and digest[0] != digest[1])


def run_night(night: Night) -> int:
    """One night: 0 passed (the last good night moves here), 1 failed, 3 not judged or an
    error (nothing moves)."""
    try:
        night.commit = worktrees.resolve(night.top, "HEAD")
    except GitError as exc:
        raise NightlyError(f"the tests' folder {night.top} is not a git checkout with a commit "
                           f"({exc}): the nightly keeps the last good commit of their "
                           "repository") from exc
    state = load_state(night.folder)
    night.check()
    last_good, anchor = state.get("last_good"), state.get("anchor")
    night.out.mkdir(parents=True, exist_ok=True)
    tonight = _environment(night)
    if last_good is not None:
        night.ab(last_good, "A/B", "ab.json")
    # The creep a night at a time that A/B against yesterday passes: A/B against the anchor
    # (night 1 or the last accepted change), where it is neither the last good night nor this.
    if anchor is not None and differs(anchor, last_good) and differs(anchor, tonight):
        night.anchor = anchor["commit"]
        night.ab(anchor, ANCHORED, "ab-anchor.json")
    night.rerecord = (state.get("rerecord") or {}).get("how", "")
    data = night.baselines(rerecord=bool(night.rerecord))
    # A baseline recorded tonight starts a case's record on night 1, after an accept, or for a
    # case the last good night did not have; else it was recorded anew because its fingerprint
    # changed (a framework's version, the accelerator stack), and no judge saw that change.
    known = None if last_good is None or night.rerecord else last_good.get("cases")
    outcome, night.unjudged = verdict_of(night.judges, set(known) if known else None)
    night.frameworks = _framework_changes(last_good, framework_versions(data))
    ab_judge = night.judges.get("A/B", {})
    if (outcome == FAILED and night.bisect and last_good is not None
            and ab_judge.get("outcome") == SLOW and last_good["commit"] != night.commit.sha):
        _bisect(night, last_good["commit"])
    _record(night, state, tonight, outcome, data)
    save_state(night.folder, state)
    (night.out / "summary.md").write_text(summary(night, last_good, outcome))
    return {PASSED: 0, FAILED: 1}.get(outcome, 3)


def _environment(night: Night) -> dict[str, Any]:
    """Tonight's commit and environment, as a night of the state records them (its copy kept
    so that a later night, or an accept, can run it)."""
    assert night.commit is not None
    try:
        lock = envs.lock_of(night.python)
        night.environment = envs.keep(night.folder, lock, night.top)
    except (envs.EnvironmentProblem, OSError, ValueError) as exc:
        night.environment = {"digest": None, "why_not_kept": str(exc)}
    return {"commit": night.commit.sha, "environment": night.environment}


def _record(night: Night, state: dict[str, Any], tonight: dict[str, Any], outcome: str,
            data: dict[str, Any] | None) -> None:
    """The night in the state; where it passed, the last good night (and, on night 1, the
    anchor) move to it; only the environments the state names stay kept."""
    cases = sorted({c for judge in night.judges.values() for c in judge.get("cases", [])})
    record = {"commit": tonight["commit"], "at": now(), "outcome": outcome, "cases": cases,
              "environment": (night.environment or {}).get("digest"),
              "judges": {k: v["outcome"] for k, v in night.judges.items()},
              **({"unjudged": night.unjudged} if night.unjudged else {})}
    state.setdefault("nights", []).append(record)
    state["last_night"] = {**tonight, "at": record["at"]}
    if night.rerecord and outcome == PASSED:
        del state["rerecord"]  # recorded: from tomorrow the baselines judge again
    if outcome == PASSED:
        state["last_good"] = {**tonight, "at": record["at"], "how": "the last night that passed",
                              "framework_versions": framework_versions(data), "cases": cases}
        # the runner's baselines learn its drift between nights from every night that passed
        night.added = add_night(night.store, data or {}, KEEP_NIGHTS)
        if state.get("anchor") is None:  # night 1: what later nights' creep is measured from
            state["anchor"] = {**state["last_good"], "how": "night 1"}
    envs.prune(night.folder, {((state.get(k) or {}).get("environment") or {}).get("digest")
                              or "" for k in ("last_good", "anchor", "last_night")})


def _framework_changes(last_good: dict[str, Any] | None, tonight: dict[str, str]) -> list[str]:
    """Each framework whose version the ranks reported differently from the last good night's
    (an interpreter of --dlperf-python is not locked: this is what says it changed)."""
    before = (last_good or {}).get("framework_versions") or {}
    return [f"{name} {before[name]} -> {version}" for name, version in sorted(tonight.items())
            if name in before and before[name] != version]


def framework_versions(data: dict[str, Any] | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for bench in (data or {}).get("benchmarks", []):
        info = bench["extra_info"]
        if info.get("framework") and info.get("framework_version"):
            found[info["framework"]] = info["framework_version"]
    return found


def summary(night: Night, last_good: dict[str, Any] | None, outcome: str) -> str:
    """The night in Markdown: the outcome and which judge decided it, then each judge."""
    commit = night.commit
    tonight = f"`{commit.short}` {commit.subject}" if commit else "?"
    lines = [f"# Nightly perf gate: {outcome}", "", f"Tonight: {tonight}."]
    if last_good is None:
        lines.append("No last good night yet (night 1): A/B had nothing to run against; "
                     "tonight judged by the baselines and the history alone.")
    else:
        lines.append(f"Last good commit: `{last_good['commit'][:10]}` ({last_good['how']}, "
                     f"{last_good['at']}).")
        if commit is not None and commit.sha != last_good["commit"]:
            lines.append(f"Commits since: {len(_since(night, last_good['commit']))} "
                         f"(`{last_good['commit'][:10]}..{commit.short}`, first parents).")
    changed = night.judges.get("A/B", {}).get("changed") or []
    if changed:
        lines.append(f"Environment: {len(changed)} change(s) since the last good night: "
                     f"{'; '.join(changed[:8])}" + (" ..." if len(changed) > 8 else "") + ".")
    if night.frameworks:
        lines.append(f"Frameworks: {'; '.join(night.frameworks)} (as the ranks reported them; "
                     "a case whose baseline was recorded anew for it was judged by A/B alone).")
    if ANCHORED in night.judges:
        lines.append(f"Anchor: `{night.anchor[:10]}` (night 1 or the last accepted change: what "
                     "a creep is measured from).")
    lines += _outcome_lines(night, outcome)
    for name, judge in night.judges.items():
        what = {SLOW: "regression", "not slow": "pass"}.get(judge["outcome"], judge["outcome"])
        against = f" against {judge['against']}" if judge.get("against") else ""
        lines += ["", f"## {name}{against}: {what}", ""]
        lines += [f"- {line}" for line in judge.get("lines") or ["(nothing to judge)"]]
    if night.bisected:
        lines += ["", "## Bisect", "", *[f"    {line}" for line in night.bisected]]
    if night.added:
        lines += ["", f"## The runner's baselines: tonight's run (the newest {KEEP_NIGHTS} nights "
                  "kept)", "", *[f"- {line}" for line in night.added]]
    recorded = night.judges.get("baselines", {}).get("recorded") or []
    if recorded:
        lines += ["", f"First night for {len(recorded)} case(s) on this runner: their "
                  f"baselines were recorded in `{night.store}` and judge from the next night on."]
    return "\n".join(lines) + "\n"


def _outcome_lines(night: Night, outcome: str) -> list[str]:
    failed_by = [name for name, judge in night.judges.items()
                 if judge.get("outcome") in (FAILED, SLOW)]
    lines = [f"Failed by: {', '.join(failed_by)}."] if failed_by else []
    if outcome == NOT_JUDGED:
        who = (f" for {len(night.unjudged)} case(s): {', '.join(night.unjudged[:5])}"
               if night.unjudged else "")
        lines.append(f"Not judged{who}: no judge could pass or fail them (below); nothing "
                     "moved, and the next night is judged against the same last good night.")
    first_slow = [line for line in night.bisected if line.startswith("first slow commit: ")]
    guess = [line for line in night.bisected if line.startswith("guess (")]
    if first_slow:
        sha, _, subject = first_slow[-1].removeprefix("first slow commit: ").partition(" ")
        lines.append(f"First slow commit: `{sha[:10]}` {subject} (bisected below).")
    elif guess:  # where the search stopped unsure: its best guess, and how sure
        lines.append(f"Bisect's {guess[-1]} (below).")
    if night.rerecord:
        lines.append(f"Baselines recorded anew after the change {night.rerecord}: tonight "
                     "records what later nights are judged against.")
    return lines


def _since(night: Night, good: str) -> list[worktrees.Commit]:
    """The first-parent commits after ``good`` up to tonight's (empty where it is not an
    ancestor: a rewritten branch)."""
    assert night.commit is not None
    try:
        return worktrees.first_parent_range(night.top, worktrees.resolve(night.top, good),
                                            night.commit)
    except GitError:
        return []


def _bisect(night: Night, good: str) -> None:
    """``dlperf bisect`` over the range, where it holds more than one commit."""
    assert night.commit is not None
    commits = _since(night, good)
    if len(commits) < 2:
        night.bisected = [f"the range holds one commit: {night.commit.short} "
                          f"{night.commit.subject}"]
        return
    built = ["--dlperf-ab-build", night.ab_build] if night.ab_build else []
    done = subprocess.run([night.python, "-m", "pytest_dlperf", "bisect", good,
                           night.commit.sha, "--", *night.pytest_args,
                           "--dlperf-ab-mode", "auto", *built],  # A/B's mode as the night's
                          cwd=night.top, capture_output=True, text=True)
    night.bisected = done.stdout.strip().splitlines()[-12:] or [f"bisect exited "
                                                                f"{done.returncode}"]


def accept(folder: Path, top: Path, revision: str, who: str) -> str:
    """A person moves the last good night (a change that costs time on purpose): to commit
    ``revision``, with the environment the last night ran (what the gate saw last)."""
    commit = worktrees.resolve(top, revision)
    state = load_state(folder)
    environment = (state.get("last_night") or {}).get("environment")
    state["last_good"] = {"commit": commit.sha, "at": now(), "how": f"accepted by {who}",
                          "framework_versions": {}, "environment": environment}
    state["anchor"] = dict(state["last_good"])  # the creep is measured from here on
    # The next night records the runner's baselines anew: the faster code's would fail the
    # accepted change, and the history's step down with them.
    state["rerecord"] = {"how": f"accepted by {who}", "at": state["last_good"]["at"]}
    save_state(folder, state)
    env = (f"; environment `{environment['digest']}` (the last night's)"
           if environment and environment.get("digest") else "")
    return f"last good commit: {commit.short} {commit.subject} (accepted by {who}){env}"
