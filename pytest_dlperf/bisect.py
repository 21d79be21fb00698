"""``dlperf bisect GOOD BAD -- PYTEST-ARGS``: the first commit after GOOD whose cases are slower
than GOOD's, by binary search over the first-parent commits up to BAD.

Each probe is an A/B run (``--dlperf-ab GOOD``) of the probe commit against GOOD: pytest runs in
a worktree of the probe commit, its base side in a worktree of GOOD, both with this plugin. A
probe is **slow** when any selected case's paired verdict is a regression, **not slow** when
every case passes (or improves). An inconclusive probe is run again with twice the pairs; still
inconclusive, the search says so and stops: it never guesses. A probe whose case was left
unjudged because the machine was busy (``machine-busy`` in the results file) is neither slow nor
fast, like git bisect's skip: it is run again once, and the search stops where it stays so. BAD
is taken at its word (as git bisect takes it) until the search would name it: then it is probed,
and if it is not slower than GOOD there is nothing to find. The probe worktrees are kept while
the search runs and removed at its end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core import worktrees
from .core.worktrees import Commit, GitError
from .verdict.busy import MACHINE_BUSY

SLOW, NOT_SLOW, INCONCLUSIVE, BROKEN = "slow", "not slow", "inconclusive", "failed to run"
BUSY = "machine busy"  # a case not judged: neither slow nor fast (git bisect's skip)


@dataclass(frozen=True)
class Probe:
    commit: Commit
    outcome: str
    lines: list[str]  # per case: its ratio and interval
    pairs: int


def classify(results: dict[str, Any]) -> tuple[str, list[str], int]:
    """A probe's outcome from its results file: any regression is slow; every case a pass or
    an improvement, not slow; else inconclusive."""
    outcomes, lines, pairs = [], [], 0
    for bench in results.get("benchmarks", []):
        info = bench["extra_info"]
        ab = info.get("ab") or {}
        outcome = ab.get("outcome", "missing")
        outcomes.append(outcome)
        pairs = max(pairs, len(ab.get("pairs", [])))
        ci = ab.get("ratio_ci")
        interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        ratio = f"{ab['ratio']:.3f}" if ab.get("ratio") else "?"
        lines.append(f"{info['case']}: head/base {ratio}{interval}, "
                     f"{len(ab.get('pairs', []))} pairs, {outcome}")
    for unjudged in results.get("dlperf_not_judged") or []:
        outcomes.append(unjudged.get("outcome", "missing"))
        lines.append(f"{unjudged.get('case', '?')}: not judged, {unjudged.get('outcome')}")
    if not outcomes:
        return BROKEN, ["no case ran"], 0
    if "regression" in outcomes:
        return SLOW, lines, pairs
    if MACHINE_BUSY in outcomes:
        return BUSY, lines, pairs
    if all(o in ("pass", "improvement") for o in outcomes):
        return NOT_SLOW, lines, pairs
    return INCONCLUSIVE, lines, pairs


def committed_problem(top: Path, args: list[str]) -> str | None:
    """Why the named test paths cannot be probed: each probe runs from a worktree of its
    commit, which has only what is committed."""
    paths = [Path(a.split("::")[0]) for a in args if not a.startswith("-")]
    named = [p.resolve() for p in paths if p.exists()]
    inside = [p for p in named if p.is_relative_to(top)]
    changed = worktrees.dirty(top, inside) if inside else []
    if changed:
        return (f"{', '.join(changed[:5])} {'has' if len(changed) == 1 else 'have'} "
                "uncommitted changes or are untracked: every probe runs from a worktree of its "
                "commit, which has only what is committed; commit (or stash) them first")
    return None


class Bisection:
    def __init__(self, top: Path, good: Commit, bad: Commit, pytest_args: list[str],
                 say: Callable[[str], None] = print) -> None:
        self.top, self.good, self.bad, self.args, self.say = top, good, bad, pytest_args, say
        self.trees = worktrees.Worktrees(top)
        self.relative = Path.cwd().resolve().relative_to(top) if Path.cwd().resolve(
        ).is_relative_to(top) else Path(".")
        self.probes: list[Probe] = []

    def probe(self, commit: Commit, extra: list[str] | None = None) -> Probe:
        tree = self.trees.get(commit)
        with tempfile.TemporaryDirectory(prefix="dlperf-bisect-") as scratch:
            out = Path(scratch) / "probe.json"
            command = [sys.executable, "-m", "pytest", *(self.in_tree(a, tree) for a in self.args),
                       "-p", "no:cacheprovider",
                       "--dlperf-ab", self.good.sha, "--dlperf-json", str(out), *(extra or [])]
            done = subprocess.run(command, cwd=tree / self.relative, capture_output=True,
                                  text=True)
            if not out.exists() or done.returncode not in (0, 1):
                tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
                return Probe(commit, BROKEN, [f"pytest exited {done.returncode}", *tail], 0)
            outcome, lines, pairs = classify(json.loads(out.read_text()))
        return Probe(commit, outcome, lines, pairs)

    def in_tree(self, arg: str, tree: Path) -> str:
        """A test path given absolute, inside the repository, made the probe worktree's: else
        every probe would run the checkout's files (``file::node`` too)."""
        file, sep, node = arg.partition("::")
        path = Path(file)
        if not path.is_absolute() or not path.resolve().is_relative_to(self.top):
            return arg
        return str(tree / path.resolve().relative_to(self.top)) + sep + node

    def judged(self, commit: Commit, index: str) -> str:
        """A probe's outcome, run again with twice the pairs once if inconclusive, and once
        as it was if the machine was busy."""
        probe = self.probe(commit)
        if probe.outcome == INCONCLUSIVE:
            self._show(probe, index, "; again with twice the pairs")
            more = str(max(2, 2 * probe.pairs))
            probe = self.probe(commit, ["--dlperf-launches", more])
        elif probe.outcome == BUSY:
            self._show(probe, index, "; neither slow nor fast, again")
            probe = self.probe(commit)
        self._show(probe, index)
        self.probes.append(probe)
        return probe.outcome

    def _show(self, probe: Probe, index: str, then: str = "") -> None:
        self.say(f"probe {index}: {probe.commit.short} {probe.commit.subject}: "
                 f"{probe.outcome}{then}")
        for line in probe.lines:
            self.say(f"    {line}")

    def run(self) -> int:
        commits = worktrees.first_parent_range(self.top, self.good, self.bad)
        if not commits:
            self.say(f"error: no commits after {self.good.short} up to {self.bad.short}")
            return 2
        self.say(f"bisecting {len(commits)} commit(s) after {self.good.short} up to "
                 f"{self.bad.short} (first parents), each an A/B against {self.good.short}")
        try:
            return self._search(commits)
        finally:
            self.trees.close()

    def _search(self, commits: list[Commit]) -> int:
        lo, hi = -1, len(commits) - 1  # commits[lo] not slow (GOOD), commits[hi] slow
        step = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            step += 1
            outcome = self.judged(commits[mid], str(step))
            if outcome == SLOW:
                hi = mid
            elif outcome == NOT_SLOW:
                lo = mid
            else:
                self.say(f"stopping: {commits[mid].short} is {outcome}; the first slow commit "
                         f"is after {commits[lo].short if lo >= 0 else self.good.short} and at "
                         f"or before {commits[hi].short} (no guess)")
                return 3
        if hi == len(commits) - 1:  # every probe was fast: is BAD slow at all?
            outcome = self.judged(commits[hi], "BAD")
            if outcome != SLOW:
                self.say(f"BAD ({self.bad.short}) is {outcome} against GOOD: "
                         + ("nothing to bisect" if outcome == NOT_SLOW else "stopping, no guess"))
                return 1 if outcome == NOT_SLOW else 3
        self.say(f"first slow commit: {commits[hi].sha} {commits[hi].subject}")
        return 0


def main(good: str, bad: str, pytest_args: list[str]) -> int:
    """The command: 0 when a first slow commit is named, 1 when BAD is not slower, 2 for bad
    input, 3 when a probe stayed inconclusive, stayed beside a busy machine or failed to run."""
    try:
        top = worktrees.toplevel(Path.cwd())
        good_commit, bad_commit = worktrees.resolve(top, good), worktrees.resolve(top, bad)
        if not worktrees.is_ancestor(top, good_commit, bad_commit):
            print(f"error: GOOD {good} ({good_commit.short}) is not an ancestor of BAD {bad} "
                  f"({bad_commit.short})", file=sys.stderr)
            return 2
        problem = committed_problem(top, pytest_args)
    except GitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return Bisection(top, good_commit, bad_commit, pytest_args,
                     lambda line: print(line, flush=True)).run()
