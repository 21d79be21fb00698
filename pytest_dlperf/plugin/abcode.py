"""Where each A/B side's ranks import the tests' repository's code from (``core.sources``): asked
of each interpreter the ranks run under (``core.installs.report``, once a session each), mapped
to the side's tree (the head: pytest's checkout; the base: a worktree of REV), refused where the
tree lacks what the checkout has (a built extension) or where the side's rank side (this
plugin's own repository at another commit) would read the head's spec otherwise than the head
wrote it, and checked against what the ranks report they imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..core import installs, sources, worktrees
from ..core.spec import RankSpec, rank_facing
from ..launch.importpath import PACKAGE, rank_import_path
from .outcome import fail

PROBE_TIMEOUT_S = 120.0


class SidesCode:
    """The sides' code of one session: the repository's checkouts, each interpreter's report,
    each side's mapping, each spec's check."""

    def __init__(self, top: Path, scratch: Path) -> None:
        self.top, self.scratch = top, scratch
        self.checkouts: sources.Checkouts | None = None
        self.reports: dict[str, dict[str, Any]] = {}
        self.sides: dict[tuple[str, str, Path], sources.Side] = {}
        self.specs: dict[tuple[str, str], str | None] = {}

    def report(self, python: str, who: str) -> dict[str, Any]:
        """What ``python``'s interpreter imports from where (asked once)."""
        if python not in self.reports:
            command = installs.probe_command(python, rank_import_path(self.scratch))
            why = ""
            try:
                done = subprocess.run(command, capture_output=True, text=True, cwd="/",
                                      timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
                why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
                self.reports[python] = json.loads(done.stdout)
            except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
                fail(f"pytest-dlperf: A/B {who}: could not ask {python} what it imports from "
                     f"where ({why or exc})")
        return self.reports[python]

    def side(self, name: str, python: str, tree: Path, who: str, plugin: Path = PACKAGE
             ) -> sources.Side:
        """Side ``name``'s code under ``python`` from ``tree`` (``plugin``: the package the
        ranks import the plugin from); a case fails naming what the tree lacks."""
        key = (name, python, tree)
        if key not in self.sides:
            if self.checkouts is None:
                self.checkouts = sources.Checkouts(worktrees.checkouts(self.top))
            links = self.scratch / "imports" / f"{name}-{len(self.sides)}"
            self.sides[key] = sources.map_side(self.report(python, who), self.checkouts, tree,
                                               links, plugin)
        side = self.sides[key]
        if side.lacking:
            fail(f"pytest-dlperf: A/B {who}: its code cannot all come from its tree "
                 f"({tree}): {'; '.join(side.lacking)}; its ranks would run the head's "
                 "instead, and the comparison would say nothing")
        return side

    def spec_problem(self, side: sources.Side, python: str, spec: RankSpec) -> str | None:
        """Where the side's ranks run another tree's plugin: why its rank side cannot read the
        head's spec as the head wrote it (None: it reads it alike)."""
        if not side.plugin_mapped:
            return None
        text = json.dumps(rank_facing(json.loads(spec.dumps())), sort_keys=True)
        key = (python, text)
        if key not in self.specs:
            self.specs[key] = _read_back(python, side, text)
        return self.specs[key]

    def check(self, side: sources.Side, env: dict[str, Any], who: str) -> None:
        """The ranks imported the side's code from where it was mapped, or the case fails."""
        if side.expected and "imports" not in env:
            return  # a rank side from before the report (this plugin's own, at an old commit)
        wrong = side.mismatches(env.get("imports") or {})
        if wrong:
            fail(f"pytest-dlperf: A/B {who}: its ranks imported {'; '.join(wrong)}: the side's "
                 "code did not come from its tree (an import hook ahead of PYTHONPATH?), and "
                 "the comparison would say nothing")


_READ_BACK = ("import json, sys; from pytest_dlperf.core.spec import RankSpec; "
              "print(json.dumps(RankSpec.from_json(json.loads(sys.stdin.read())).to_json(), "
              "sort_keys=True))")


def _read_back(python: str, side: sources.Side, text: str) -> str | None:
    """Parse the head's spec with the side's own rank side and compare what it reads."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(side.import_paths)}
    try:
        done = subprocess.run([python, "-c", _READ_BACK], input=text, capture_output=True,
                              text=True, cwd="/", env=env, timeout=PROBE_TIMEOUT_S)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return f"its rank side cannot read the head's spec: {last}"
        written, read = json.loads(text), json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return f"its rank side could not be asked to read the head's spec ({exc})"
    differ = sorted(k for k, v in written.items() if read.get(k) != json.loads(json.dumps(v)))
    if differ:
        return f"its rank side reads the head's spec otherwise: {', '.join(differ)}"
    return None


def describe(side: sources.Side, top: Path) -> dict[str, Any]:
    """What the A/B facts and header say of a side's code."""
    tree = "this checkout" if side.tree == top.resolve() else str(side.tree)
    return {"tree": tree, "taken": list(dict.fromkeys(side.taken)),
            "same": list(dict.fromkeys(side.same))}


def python_of(pythons: dict[str, str], framework: str) -> str:
    """The interpreter a side's ranks run under: the framework's own, else pytest's."""
    return pythons.get(framework) or sys.executable
