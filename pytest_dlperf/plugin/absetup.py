"""The base side of an A/B run (``--dlperf-ab REV``, ``--dlperf-ab-python PATH``), settled
once a session before anything is collected: REV's commit (a usage error when it is none), a
worktree of it made on first use and removed at the session's end, and the base side's
interpreter. How a case runs in A/B mode: ``ab``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..core import worktrees
from ..core.recipes import RecipeReference
from ..core.spec import RankSpec
from ..launch import Cluster
from .outcome import fail

if TYPE_CHECKING:
    from .settings import Settings


@dataclass
class AbSetup:
    """The session's base side: REV's commit and worktree, and/or its interpreter."""

    revision: str | None
    commit: worktrees.Commit | None
    top: Path | None
    python: str | None
    head: str  # how the head is described: "working tree at <sha>" (+ uncommitted changes)
    trees: worktrees.Worktrees | None = None
    mode: str = "turns"  # --dlperf-ab-mode: "turns", "duet" (``duet``) or "auto" (either)

    @classmethod
    def open(cls, settings: Settings, rootpath: Path) -> AbSetup | None:
        """Checked before anything is collected: a usage error for an unknown revision, a
        folder outside git, and options A/B cannot go with."""
        if settings.ab is None and settings.ab_python is None:
            return None
        for clash, given in (("--dlperf-update-baselines", settings.update_baselines),
                             ("--dlperf-batch-size max", settings.batch_size == "max" or None)):
            if given:
                raise pytest.UsageError(
                    f"pytest-dlperf: --dlperf-ab/--dlperf-ab-python cannot go with {clash}: an "
                    "A/B run judges head against base from its own pairs and reads or writes "
                    f"no baseline; run the two apart")
        top = commit = None
        head = "this checkout"
        try:
            if settings.ab is not None:
                top = worktrees.toplevel(rootpath)
                commit = worktrees.resolve(top, settings.ab)
                at = worktrees.resolve(top, "HEAD")
                head = f"working tree at {at.short}" + uncommitted(
                    worktrees.dirty(top, leave_out=own_files(settings)))
        except worktrees.GitError as exc:
            raise pytest.UsageError(f"pytest-dlperf: --dlperf-ab={settings.ab}: {exc}") from None
        return cls(settings.ab, commit, top, settings.ab_python, head, mode=settings.ab_mode)

    @property
    def base(self) -> str:
        parts = []
        if self.commit is not None:
            parts.append(f"{self.revision} at {self.commit.short} ({self.commit.subject})")
        if self.python is not None:
            parts.append(f"ranks under {self.python}")
        return ", ".join(parts)

    def worktree(self) -> Path | None:
        if self.commit is None or self.top is None:
            return None
        if self.trees is None:
            self.trees = worktrees.Worktrees(self.top)
        try:
            return self.trees.get(self.commit)
        except worktrees.GitError as exc:
            fail(f"pytest-dlperf: A/B base side ({self.base}): its worktree could not be made: "
                 f"{exc}")

    def close(self) -> None:
        if self.trees is not None:
            self.trees.close()

    # -- the base side of one case ----------------------------------------------------------

    def base_spec(self, node: pytest.Item, spec: RankSpec) -> RankSpec:
        """The head's spec with the recipe imported from REV's worktree; a case whose test
        the base lacks fails naming the side."""
        tree = self.worktree()
        if tree is None or self.top is None:
            return spec
        test = Path(str(node.path)).resolve()
        if test.is_relative_to(self.top) and not (tree / test.relative_to(self.top)).exists():
            fail(f"pytest-dlperf: A/B base side ({self.base}): {test.relative_to(self.top)} "
                 "does not exist there: the test is new in the head, and A/B compares a case "
                 "both sides have (pick a base that has it)")
        recipe = spec.recipe
        if recipe is None or recipe.path is None:
            return spec  # an installed module: the same on both sides
        root = Path(recipe.path).resolve()
        if not root.is_relative_to(self.top):
            return spec
        return replace(spec, recipe=RecipeReference(recipe.module, recipe.qualname,
                                                    str(tree / root.relative_to(self.top))))

    def base_cluster(self, cluster: Cluster, framework: str) -> Cluster:
        if self.python is None:
            return cluster
        return Cluster(cluster.topology, cluster.launcher, cluster.work_root, cluster.timeout_s,
                       {**cluster.pythons, framework: self.python})


def own_files(settings: Settings) -> list[Path]:
    """What the plugin itself writes where it may be inside the repository: the baseline store
    (its files and its lock), the results file, a SQLite history and its journals. An earlier
    run's or an update's files there are not the user's changes to the code under test."""
    paths = [settings.baselines]
    if settings.json is not None:
        paths.append(settings.json)
    if settings.history is not None and "://" not in settings.history:
        paths += [Path(settings.history + suffix) for suffix in ("", "-journal", "-wal", "-shm")]
    return paths


def uncommitted(changed: list[str], named: int = 3) -> str:
    """The user's changes the head runs with, counted and the first few named."""
    if not changed:
        return ""
    more = f" and {len(changed) - named} more" if len(changed) > named else ""
    return (f" with {len(changed)} uncommitted change(s): {', '.join(changed[:named])}"
            f"{more}")
