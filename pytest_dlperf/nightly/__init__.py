"""``dlperf nightly run|accept|status``: the nightly gate, three judges in one night.

A night runs the selected tests in pytest sessions of their own:

1. **A/B against the last good night** (``--dlperf-ab-mode auto``: duet where a case fits in half
   the machine, turns where it does not): the base side runs the last good night's code (its
   commit, ``--dlperf-ab``) where tonight's commit differs, and its environment (a kept copy,
   ``--dlperf-ab-python``) where tonight's environment differs, the packages named
   (``environments``): the step a commit or an upgrade makes, seen the night it lands, whatever
   the runner's drift between nights (A/B cancels it); and, where it is another night, **A/B
   against the anchor** (night 1 or the last accepted change): a creep of 1% a night passes each
   night's A/B against yesterday and adds up against the anchor;
2. **the baselines and the history**, as the gate always judged (``--dlperf-update-baselines
   missing``, ``--dlperf-history``): the creep a night at a time that A/B is blind to.

A night fails when a judge proves a regression; it passes only on a judgement, every case passed
by a judge or recorded tonight (``judges``); otherwise it is not judged and moves nothing. The
**last good night** (its commit of the tests' repository, its environment, each framework's
version) is kept in the runner's folder of the store (``nightly.json``, beside its baselines,
history and kept environments): a failing or unjudged night leaves it where it was, a person
moves it (``dlperf nightly accept [REV]``: the commit, and the last night's environment). Night
1 has none, says so, and judges by the baselines alone (recording them).

On an A/B failure, ``--bisect`` runs ``dlperf bisect`` over the range when it holds more than one
commit, and the summary names the first slow commit. The summary (``summary.md``) says which
judge failed the night and each judge's figures.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..core import worktrees
from ..core.worktrees import GitError
from .judges import FAILED, NOT_JUDGED, PASSED, judge_ab, judge_baselines, verdict_of
from .night import ANCHORED, Night, accept, run_night
from .state import STATE, NightlyError, default_store, load_state, machine_name

__all__ = ["ANCHORED", "FAILED", "NOT_JUDGED", "PASSED", "STATE", "Night", "NightlyError",
           "accept", "judge_ab", "judge_baselines", "load_state", "main", "run_night",
           "verdict_of"]


def test_paths(pytest_args: list[str]) -> list[str]:
    """The test paths among pytest's arguments (existing files or folders, with or without a
    ``::`` node part)."""
    return [a for a in pytest_args if not a.startswith("-") and Path(a.split("::")[0]).exists()]


def _absolute(path: str) -> str:
    """A test path (``file::node`` too) made absolute: the sessions run from the tests' top."""
    file, sep, node = path.partition("::")
    return str(Path(file).resolve()) + sep + node


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
                      pytest_args=args, bisect=bisect,
                      ab_build=os.environ.get("DLPERF_NIGHTLY_AB_BUILD", ""))
        return run_night(night)
    except (NightlyError, GitError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
