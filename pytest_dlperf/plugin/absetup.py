"""The base side of an A/B run (``--dlperf-ab REV``, ``--dlperf-ab-python PATH``,
``--dlperf-ab-build COMMAND``), settled once a session before anything is collected: REV's
commit (a usage error when it is none), a worktree of it made on first use and removed at the
session's end, the base side's interpreter (or an overlay environment built from the worktree),
and where each side's ranks import the tests' repository's code from (``abcode``). How a case
runs in A/B mode: ``ab``."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..core import lifeline, overlay, sources, worktrees
from ..core.recipes import RecipeReference
from ..core.spec import RankSpec
from ..launch import Cluster
from ..launch.importpath import PACKAGE
from .abcode import SidesCode, describe, python_of
from .outcome import fail

if TYPE_CHECKING:
    from .settings import Settings


@dataclass
class AbSetup:
    """The session's base side: REV's commit and worktree, and/or its interpreter."""

    revision: str | None
    commit: worktrees.Commit | None
    top: Path | None
    pythons: dict[str, str] | None  # --dlperf-ab-python: "*" in place of pytest's, or by framework
    head: str  # how the head is described: "working tree at <sha>" (+ uncommitted changes)
    trees: worktrees.Worktrees | None = None
    mode: str = "turns"  # --dlperf-ab-mode: "turns", "duet" (``duet``) or "auto" (either)
    build: str | None = None  # --dlperf-ab-build: the command that builds the base side
    code: SidesCode | None = None  # where each side's code comes from (made on first use)
    overlays: dict[str, overlay.Overlay] = field(default_factory=dict)  # by base interpreter

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
        return cls(settings.ab, commit, top, settings.ab_python, head, mode=settings.ab_mode,
                   build=settings.ab_build)

    @property
    def base(self) -> str:
        parts = []
        if self.commit is not None:
            parts.append(f"{self.revision} at {self.commit.short} ({self.commit.subject})")
        for name, python in (self.pythons or {}).items():
            parts.append(f"ranks under {python}" if name == "*" else
                         f"{name} ranks under {python}")
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
        if self.code is not None:
            shutil.rmtree(self.code.scratch, ignore_errors=True)
        for made in self.overlays.values():
            shutil.rmtree(made.folder, ignore_errors=True)
        self.overlays.clear()
        if self.trees is not None:
            self.trees.close()

    # -- each side of one case --------------------------------------------------------------

    def side_spec(self, node: pytest.Item, spec: RankSpec, side: str, cluster: Cluster
                  ) -> tuple[RankSpec, sources.Side | None]:
        """The head's spec for one side: the base's recipe and adapter imported from REV's
        worktree; each side's import paths (its tree's code first on its ranks' path) and the
        mapping its ranks' imports are checked against (None: nothing to map, no REV)."""
        tree = self.top if side == "head" else self.worktree()
        if tree is None or self.top is None:
            return spec, None
        who = f"{side} side ({self.head if side == 'head' else self.base})"
        if side == "base":
            spec = self._from_worktree(node, spec, tree)
        if self.code is None:
            scratch = worktrees.scratch(self.top)
            lifeline.sweep(scratch, "ab-*")  # what a run killed too hard to clean up left
            self.code = SidesCode(self.top, Path(tempfile.mkdtemp(prefix="ab-", dir=scratch)))
            lifeline.claim(self.code.scratch)
        python = python_of(cluster.pythons, spec.framework)
        code = self.code.side(side, python, tree, who, self._plugin())
        problem = self.code.spec_problem(code, python, spec)
        if problem:
            fail(f"pytest-dlperf: A/B {who}: {problem}: the plugin's rank side at its commit "
                 "and the head's pytest side disagree on what a case is; pick a base at or "
                 "after the change to the rank spec (core/spec.py)")
        return replace(spec, import_paths=code.import_paths or None, cwd=self._cwd(tree),
                       expected_imports=sorted(code.expected) or None), code

    def _plugin(self) -> Path:
        """The plugin the ranks import: from pytest's folder where it holds the package (``python
        -m`` puts it first: this plugin's own repository, even with the plugin installed as a
        copy), else the one pytest runs."""
        here = Path.cwd().resolve()
        local = here / sources.PLUGIN
        if self.top is not None and here.is_relative_to(self.top.resolve()) and (
                local / "__init__.py").exists():
            return local
        return PACKAGE

    def _cwd(self, tree: Path) -> str | None:
        """The folder a side's ranks start in: pytest's own, as the side's tree has it, where
        pytest runs in this checkout and the tree is another (``python -m`` puts the working
        folder first on the ranks' path: in this plugin's own repository it holds the plugin);
        None: pytest's."""
        assert self.top is not None
        here = Path.cwd().resolve()
        if tree.resolve() == self.top.resolve() or not here.is_relative_to(self.top.resolve()):
            return None
        folder = tree / here.relative_to(self.top.resolve())
        while not folder.is_dir() and folder != tree:  # a folder the side's commit lacks
            folder = folder.parent
        return str(folder)

    def _from_worktree(self, node: pytest.Item, spec: RankSpec, tree: Path) -> RankSpec:
        """The spec with the recipe's and a user's own adapter's import roots mapped from this
        checkout into ``tree``; a case whose test the base lacks fails naming the side."""
        assert self.top is not None
        test = Path(str(node.path)).resolve()
        if test.is_relative_to(self.top) and not (tree / test.relative_to(self.top)).exists():
            fail(f"pytest-dlperf: A/B base side ({self.base}): {test.relative_to(self.top)} "
                 "does not exist there: the test is new in the head, and A/B compares a case "
                 "both sides have (pick a base that has it)")
        recipe, adapter = spec.recipe, spec.adapter_path
        if recipe is not None and recipe.path is not None:
            recipe = RecipeReference(recipe.module, recipe.qualname,
                                     self._mapped(recipe.path, tree))
        if adapter is not None:
            adapter = self._mapped(adapter, tree)
        return replace(spec, recipe=recipe, adapter_path=adapter)

    def _mapped(self, folder: str, tree: Path) -> str:
        """``folder`` of this checkout as ``tree``'s (as it is where outside the checkout)."""
        assert self.top is not None
        root = Path(folder).resolve()
        return str(tree / root.relative_to(self.top)) if root.is_relative_to(self.top) \
            else folder

    def clusters(self, cluster: Cluster, framework: str) -> dict[str, Cluster]:
        """Each side's cluster: the base's ranks under --dlperf-ab-python, or under the overlay
        --dlperf-ab-build made from the worktree; the head's under such an overlay too where
        pytest runs in a linked worktree (a bisect probe's), whose built files the checkout
        the editable installs name has and it lacks. A base side that would be the head itself
        fails the case."""
        python = self.base_python(cluster, framework)
        sides = {"head": cluster, "base": cluster}
        if self.build is not None and self.top is not None:
            head_python = python_of(cluster.pythons, framework)
            python = self._built(python or head_python, "base").python
            if worktrees.is_linked(self.top):
                sides["head"] = _under(cluster, framework, self._built(head_python,
                                                                       "head").python)
        elif self.commit is None and python in (None, python_of(cluster.pythons, framework)):
            fail(f"pytest-dlperf: A/B base side ({self.base}): {framework}'s ranks would run "
                 f"the head's code under the head's interpreter "
                 f"({python_of(cluster.pythons, framework)}): --dlperf-ab-python names none "
                 f"for them (give PATH, in place of pytest's interpreter, or {framework}=PATH)")
        if python is not None:
            sides["base"] = _under(cluster, framework, python)
        return sides

    def base_python(self, cluster: Cluster, framework: str) -> str | None:
        """The base side's interpreter for ``framework`` where --dlperf-ab-python names one:
        the framework's own entry, else the stand-in for pytest's interpreter where the head
        runs the framework under it (None: the head's)."""
        pythons = self.pythons or {}
        if framework in pythons:
            return pythons[framework]
        return pythons.get("*") if framework not in cluster.pythons else None

    def _built(self, python: str, side: str) -> overlay.Overlay:
        """The overlay of ``python``'s environment with the build command run in the side's
        tree (REV's worktree; the head's: pytest's checkout), once a session each."""
        key = f"{side}:{python}"
        if key not in self.overlays:
            tree = self.worktree() if side == "base" else self.top
            assert tree is not None and self.build is not None and self.top is not None
            scratch = worktrees.scratch(self.top)
            lifeline.sweep(scratch, "ab-env-*")  # what a killed run left
            folder = Path(tempfile.mkdtemp(prefix="ab-env-", dir=scratch))
            lifeline.claim(folder)
            try:
                self.overlays[key] = overlay.make(python, folder, self.build, tree)
            except (overlay.OverlayError, OSError) as exc:
                shutil.rmtree(folder, ignore_errors=True)
                fail(f"pytest-dlperf: A/B {side} side ({self.base if side == 'base' else self.head})"
                     f": --dlperf-ab-build could not build it: {exc}")
        return self.overlays[key]

    def check_imports(self, side: str, code: sources.Side | None, env: dict[str, Any]
                      ) -> None:
        """A side's ranks imported the repository's code from that side's tree."""
        if code is not None and self.code is not None:
            who = f"{side} side ({self.head if side == 'head' else self.base})"
            self.code.check(code, env, who)

    def code_facts(self, codes: dict[str, sources.Side | None],
                   specs: dict[str, RankSpec]) -> dict[str, Any] | None:
        """What the A/B facts say of where each side's code came from: its tree, the tests'
        folder, what came from the tree, what is the same on both sides, how it was built."""
        if not any(codes.values()) or self.top is None:
            return None
        facts: dict[str, Any] = {}
        for side, code in codes.items():
            if code is None:
                continue
            facts[side] = describe(code, self.top)
            recipe = specs[side].recipe
            if recipe is not None and recipe.path is not None and Path(
                    recipe.path).resolve().is_relative_to(code.tree):
                tests = Path(recipe.path).resolve().relative_to(code.tree).as_posix()
                facts[side]["taken"] = [f"{tests}/ (the tests)", *facts[side]["taken"]]
        if self.overlays and "base" in facts:
            facts["base"]["built"] = "; ".join(o.describe() for o in self.overlays.values())
        return facts


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


def _under(cluster: Cluster, framework: str, python: str) -> Cluster:
    """``cluster`` with ``framework``'s ranks under ``python``."""
    return Cluster(cluster.topology, cluster.launcher, cluster.work_root, cluster.timeout_s,
                   {**cluster.pythons, framework: python})
