"""``dlperf bisect GOOD BAD -- PYTEST-ARGS``: the first commit after GOOD whose cases are slower
than GOOD's, by binary search over the first-parent commits up to BAD.

Each probe is an A/B run (``--dlperf-ab GOOD``) of the probe commit against GOOD: pytest runs in
a worktree of the probe commit, its base side in a worktree of GOOD, both with this plugin.
BAD is probed first: the cases whose A/B verdict there is a regression are the slowdown hunted,
their level at BAD (head/base) **the slow end**; GOOD's end is 1. Each later probe is judged
against both ends (``judge``, ``against_ends``): **not slow** where it rules out the slow end
and not 1, **slow** where it rules out 1 and not the slow end, the nearer end where it rules
out both (a partial slowdown), **inconclusive** where neither: it takes more pairs, and if it
still rules out neither the search stops with its best guess and how likely that is. A probe
whose case was not judged because the machine was busy (``machine-busy``) is neither slow nor
fast, like git bisect's skip: it is run again once. The probes' worktrees go at the end.

The last line is ``first slow commit: SHA SUBJECT`` where every probe was decided, ``guess (NN%
sure, not proven): first slow commit ...`` where the search stopped on a probe within neither
end. Exit status (``main``): 0 a first slow commit named, 1 BAD not slower than GOOD, 2 bad
input, 3 stopped without a sure answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core import worktrees
from .core.worktrees import Commit, GitError
from .verdict.busy import MACHINE_BUSY
from .verdict.ends import (
    INCONCLUSIVE,
    MORE_ROUNDS,
    NOT_SLOW,
    PROBE_ALPHA,
    SLOW,
    Level,
    judge,
    level_of,
)

BROKEN = "failed to run"
BUSY = "machine busy"  # a case not judged: neither slow nor fast (git bisect's skip)

# Runs of a probe after its first while it rules out neither end (``verdict.ends.MORE_ROUNDS``).
# In turns the runs' pairs are pooled and each run more doubles them (3, 6, 12 with three a
# run); in duet each run has twice the pairs of the last and is judged alone (the halves'
# difference is taken out within a run). At most MOST_PAIRS a run.
MOST_PAIRS = 24
__all__ = ["BROKEN", "BUSY", "INCONCLUSIVE", "MORE_ROUNDS", "MOST_PAIRS", "NOT_SLOW",
           "PROBE_ALPHA", "SLOW", "Level", "judge", "level_of", "main"]


def facts_of(runs: list[dict[str, Any]], case: str) -> list[dict[str, Any]]:
    """A case's ``ab`` facts in each of the results files ``runs`` where it was judged."""
    return [b["extra_info"].get("ab") or {} for run in runs for b in run.get("benchmarks", [])
            if b["extra_info"]["case"] == case]


@dataclass(frozen=True)
class Probe:
    commit: Commit
    outcome: str
    lines: list[str]  # per case: its ratio and interval (and how it stands against the ends)
    pairs: int  # behind the outcome
    levels: dict[str, Level | None] = field(default_factory=dict)  # BAD's regressions
    guess: tuple[str, float] | None = None  # inconclusive: the nearer end, how likely
    more: int = 0  # pairs the next run takes while it is inconclusive


def classify(results: dict[str, Any]) -> tuple[str, list[str], int]:
    """A run's outcome from its A/B verdicts: any regression is slow; every case a pass or
    an improvement, not slow; else inconclusive (BAD's probe: the slowdown hunted)."""
    outcomes, lines, pairs = [], [], 0
    for bench in results.get("benchmarks", []):
        info = bench["extra_info"]
        ab = info.get("ab") or {}
        outcomes.append(ab.get("outcome", "missing"))
        pairs = max(pairs, len(ab.get("pairs", [])))
        lines.append(_case_line(info["case"], ab))
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


def _case_line(case: str, ab: dict[str, Any]) -> str:
    ci = ab.get("ratio_ci")
    interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
    ratio = f"{ab['ratio']:.3f}" if ab.get("ratio") else "?"
    return (f"{case}: head/base {ratio}{interval}, {len(ab.get('pairs', []))} pairs, "
            f"{ab.get('outcome', 'missing')}")


def against_ends(commit: Commit, runs: list[dict[str, Any]], ends: dict[str, Level]) -> Probe:
    """A probe of ``commit`` from the results of its runs so far (oldest first), each hunted
    case (``ends``: its slow end) judged against both ends over its pooled pairs: slow where any
    is slow, not slow where every one is, else inconclusive with a guess (the end the odds of
    its undecided cases favour) and how likely it is."""
    last = runs[-1]
    busy = {u.get("case") for u in last.get("dlperf_not_judged") or []
            if u.get("outcome") == MACHINE_BUSY}
    lines, sides, odds, most = [], [], 1.0, 0
    for case, slow in ends.items():
        if case in busy:
            return Probe(commit, BUSY, [f"{case}: not judged, {MACHINE_BUSY}"], 0)
        facts = facts_of(runs, case)
        if not facts:
            return Probe(commit, BROKEN, [f"{case}: did not run at this commit",
                                          *last.get("dlperf_output_tail", [])], 0)
        level, pairs = level_of(facts)
        most = max(most, pairs)
        verdict = judge(level, slow) if level is not None else None
        pooled = f"; over the {pairs} pairs of {len(facts)} runs" if len(facts) > 1 and (
            pairs != len(facts[-1].get("pairs") or [])) else ""
        lines.append(f"{_case_line(case, facts[-1])}{pooled}; "
                     + (verdict.text(slow) if verdict else "too few pairs to judge"))
        sides.append(verdict.side if verdict else INCONCLUSIVE)
        if verdict is None or verdict.side == INCONCLUSIVE:  # (a decided one is sure)
            odds *= verdict.good_odds if verdict else 0.5
    outcome = (SLOW if SLOW in sides else NOT_SLOW if all(s == NOT_SLOW for s in sides)
               else INCONCLUSIVE)
    # the guess is the end the odds favour (every undecided case at the good end, or not),
    # sure by as much as they favour it
    guess = ((NOT_SLOW, odds) if odds >= 0.5 else (SLOW, 1 - odds)) \
        if outcome == INCONCLUSIVE else None
    duet = any((b["extra_info"].get("ab") or {}).get("mode") == "duet"
               for b in last.get("benchmarks", []))
    return Probe(commit, outcome, lines, most, guess=guess, more=2 * most if duet else most)


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
        self.ends: dict[str, Level] = {}  # the hunted cases and their slow end (from BAD)

    def probe(self, commit: Commit, extra: list[str], runs: list[dict[str, Any]]) -> Probe:
        """A run at ``commit`` added to its ``runs`` and read: against both ends; BAD's (no
        ends yet) by its A/B verdicts, its regressions' levels the slow end."""
        results = self.results(commit, extra)
        if isinstance(results, Probe):
            return results
        runs.append(results)
        if self.ends:
            return against_ends(commit, runs, self.ends)
        outcome, lines, pairs = classify(results)
        slow = [b["extra_info"]["case"] for b in results.get("benchmarks", [])
                if (b["extra_info"].get("ab") or {}).get("outcome") == "regression"]
        levels = {case: level_of(facts_of(runs, case))[0] for case in slow}
        return Probe(commit, outcome, lines, pairs, levels, more=2 * pairs)

    def results(self, commit: Commit, extra: list[str]) -> dict[str, Any] | Probe:
        """The results file of pytest's A/B run at ``commit``; a failed probe where none."""
        tree = self.trees.get(commit)
        with tempfile.TemporaryDirectory(prefix="dlperf-bisect-") as scratch:
            out = Path(scratch) / "probe.json"
            command = [sys.executable, "-m", "pytest", *(self.in_tree(a, tree) for a in self.args),
                       "-p", "no:cacheprovider",
                       "--dlperf-ab", self.good.sha, "--dlperf-json", str(out), *extra]
            done = subprocess.run(command, cwd=tree / self.relative, capture_output=True,
                                  text=True)
            if not out.exists() or done.returncode not in (0, 1):
                tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
                return Probe(commit, BROKEN, [f"pytest exited {done.returncode}", *tail], 0)
            results: dict[str, Any] = json.loads(out.read_text())
            if done.returncode == 1:  # why a case that did not run failed (a side refused)
                results["dlperf_output_tail"] = [
                    line for line in (done.stdout + done.stderr).strip().splitlines()
                    if "pytest-dlperf:" in line][-6:]
            return results

    def in_tree(self, arg: str, tree: Path) -> str:
        """A test path given absolute, inside the repository, made the probe worktree's: else
        every probe would run the checkout's files (``file::node`` too)."""
        file, sep, node = arg.partition("::")
        path = Path(file)
        if not path.is_absolute() or not path.resolve().is_relative_to(self.top):
            return arg
        return str(tree / path.resolve().relative_to(self.top)) + sep + node

    def judged(self, commit: Commit, index: str) -> Probe:
        """A probe, run again once as it was if the machine was busy, and with more pairs up to
        ``MORE_ROUNDS`` times while inconclusive."""
        runs: list[dict[str, Any]] = []
        extra: list[str] = []
        busy_left, rounds = 1, 0
        while True:
            probe = self.probe(commit, extra, runs)
            if probe.outcome == BUSY and busy_left:
                busy_left -= 1
                self._show(probe, index, "; neither slow nor fast, again")
            elif probe.outcome == INCONCLUSIVE and rounds < MORE_ROUNDS:
                rounds += 1
                extra = ["--dlperf-launches", str(min(MOST_PAIRS, max(2, probe.more)))]
                self._show(probe, index, f"; again, {extra[1]} pairs more (run {rounds + 1} "
                           f"of at most {MORE_ROUNDS + 1})")
            else:
                break
        self._show(probe, index)
        return probe

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
            return self._slow_end() or self._search(commits)
        finally:
            self.trees.close()

    def _slow_end(self) -> int | None:
        """BAD's probe: the slow end's level of each case slower there; an exit status where
        there is none."""
        probe = self.judged(self.bad, "BAD")
        self.ends = {case: level for case, level in probe.levels.items() if level is not None}
        if probe.outcome == SLOW and self.ends:
            for case, level in self.ends.items():
                self.say(f"the slow end: {case} {level.ratio:.3f} of GOOD's throughput at BAD")
            return None
        if probe.outcome == NOT_SLOW:
            self.say(f"BAD ({self.bad.short}) is not slower than GOOD: nothing to bisect")
            return 1
        self.say(f"stopping: BAD ({self.bad.short}) is {probe.outcome} against GOOD: no case "
                 "is proven slower there, so there is no slow end to classify probes by")
        return 3

    def _search(self, commits: list[Commit]) -> int:
        lo, hi = -1, len(commits) - 1  # commits[lo] not slow (GOOD), commits[hi] slow (BAD)
        step = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            step += 1
            probe = self.judged(commits[mid], str(step))
            if probe.outcome == SLOW:
                hi = mid
            elif probe.outcome == NOT_SLOW:
                lo = mid
            else:
                return self._stop(commits, lo, mid, hi, probe)
        self.say(f"first slow commit: {commits[hi].sha} {commits[hi].subject}")
        return 0

    def _stop(self, commits: list[Commit], lo: int, mid: int, hi: int, probe: Probe) -> int:
        """The search ends on ``probe`` (inconclusive, busy or broken): where the first slow
        commit must lie, and the best guess where the probe read the ends."""
        def after(i: int) -> str:
            return commits[i].short if i >= 0 else self.good.short

        self.say(f"stopping: {commits[mid].short} is {probe.outcome}; the first slow commit is "
                 f"after {after(lo)} and at or before {commits[hi].short}"
                 + ("" if probe.guess else " (no guess: no reading of the ends)"))
        if probe.guess is None:
            return 3
        side, likely = probe.guess
        first, last = (lo, mid) if side == SLOW else (mid, hi)
        where = (f"{commits[last].sha} {commits[last].subject}" if last - first == 1 else
                 f"after {after(first)} and at or before {commits[last].short} "
                 f"({last - first} commits)")
        self.say(f"guess ({likely:.0%} sure, not proven): first slow commit {where}")
        return 3


def main(good: str, bad: str, pytest_args: list[str]) -> int:
    """The command: 0 when a first slow commit is named, 1 when BAD is not slower, 2 for bad
    input, 3 when the search stopped without a sure answer (a probe that ruled out neither end:
    its guess is printed; one that failed to run or stayed beside a busy machine; BAD not
    proven slower)."""
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
