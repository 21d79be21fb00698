"""Where an A/B side's ranks import the tests' repository's code from.

The head's ranks import a team's code from a checkout of the repository: the tests' folder (the
recipe's import root), packages installed editable from it (a path ``.pth``'s folder on
``sys.path``, or an import hook's module), and, in this plugin's own repository, the plugin's
rank side (built-in workloads, trainers). An A/B side runs a tree of its own (a worktree of its
commit; in a bisect probe the head too), so ``map_side`` takes each of those from that tree:
folders on ``sys.path`` become the tree's same folders, modules an import hook maps become
links in a folder of the side's own (``links``), both put first on the ranks' ``PYTHONPATH``
(``import_paths``), where they win over ``.pth`` lines and appended finders. What cannot be
taken from the tree is said (``same``: a copy installed with ``pip install .``, a package
editable from another repository), and what the tree lacks that the checkout has is a problem
(``lacking``: a compiled extension built in the checkout, a folder on the path the side's
commit does not have), refused before a launch rather than measured with the head's code.
``expected`` is where each module must come from, checked against what the ranks report they
imported (``installs.imported``). Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .installs import COMPILED

PLUGIN = "pytest_dlperf"


@dataclass
class Side:
    """One A/B side's code: its tree, the folders first on its ranks' path, where each of the
    repository's modules must come from, and what is said of it."""

    tree: Path
    import_paths: list[str] = field(default_factory=list)
    expected: dict[str, str] = field(default_factory=dict)
    taken: list[str] = field(default_factory=list)  # what comes from the tree
    same: list[str] = field(default_factory=list)  # what cannot: the same on both sides
    lacking: list[str] = field(default_factory=list)  # what the tree lacks: refused

    @property
    def plugin_mapped(self) -> bool:
        """Whether the ranks run another tree's plugin than pytest's own (the base's rank side
        of this plugin's own repository)."""
        here = str(Path(__file__).resolve().parents[1])
        return PLUGIN in self.expected and self.expected[PLUGIN] != here

    def mismatches(self, imported: dict[str, str]) -> list[str]:
        """The modules a rank imported from elsewhere than this side's tree, named."""
        wrong = []
        for name, expected in self.expected.items():
            got = imported.get(name)
            if got is not None and got != expected and not got.startswith(expected + os.sep):
                wrong.append(f"{name} from {got} (expected {expected})")
        return wrong


class Checkouts:
    """The repository's checkouts (``worktrees.checkouts``): which one holds a path."""

    def __init__(self, roots: Sequence[Path], environments: Sequence[Path] = ()) -> None:
        self.roots = sorted((Path(r).resolve() for r in roots), key=lambda p: len(p.parts),
                            reverse=True)
        self.environments = [Path(p).resolve() for p in environments]

    def outside(self, environments: Sequence[Path]) -> Checkouts:
        """The same checkouts, paths inside ``environments`` (interpreters' own folders) not
        counted as the repository's."""
        return Checkouts(self.roots, [*self.environments, *environments])

    def where(self, path: str | Path) -> tuple[Path, Path] | None:
        """(checkout, path relative to it) for a path of the repository's code inside one, the
        deepest; else None: outside them, or an environment that lives in a checkout (a
        project's ``.venv``, the plugin's own scratch: installed code, not the repository's)."""
        real = Path(os.path.realpath(path))
        if any(real.is_relative_to(env) for env in self.environments):
            return None
        for root in self.roots:
            if real.is_relative_to(root):
                relative = real.relative_to(root)
                if _installed(root, relative):
                    return None
                return root, relative
        return None


def _installed(root: Path, relative: Path) -> bool:
    """Whether ``relative`` (in checkout ``root``) is in an environment, not the code: the
    plugin's scratch, site-packages, a virtual environment's or a conda environment's folder."""
    parts = relative.parts
    if parts[:1] == (".pytest-dlperf",) or {"site-packages", "dist-packages"} & set(parts):
        return True
    folder = root
    for part in parts[:-1]:
        folder = folder / part
        if (folder / "pyvenv.cfg").exists() or (folder / "conda-meta").is_dir():
            return True
    return False


def map_side(report: dict[str, Any], checkouts: Checkouts, tree: Path, links: Path,
             plugin: Path | None = None) -> Side:
    """Side ``tree``'s code for ranks whose interpreter ``report``s (``installs.report``) what
    it imports from where; ``links``: the side's own folder for links to the tree's modules;
    ``plugin``: the plugin's package pytest runs (mapped where the repository holds it)."""
    tree = tree.resolve()
    side = Side(tree)
    # an interpreter's own folders (a conda or pixi environment kept in the repository): not
    # the repository's code
    checkouts = checkouts.outside([Path(p) for p in report.get("prefixes", [])])
    moved: list[tuple[Path, Path]] = []  # (a folder on the head's path, the tree's same)
    for entry in report.get("sys_path", []):
        found = checkouts.where(entry)
        if found is None or found[0] == tree:
            continue
        target = tree / found[1]
        if not target.is_dir():
            side.lacking.append(f"{found[1].as_posix() or '.'}/ is on the ranks' sys.path but "
                                "not in this side's tree: its ranks would import the head's")
            continue
        moved.append((Path(os.path.realpath(entry)), target))
        side.import_paths.append(str(target))
        side.taken.append(f"{found[1].as_posix() or '.'}/ (on sys.path)")
    linked: dict[str, Path] = {}
    for dist in report.get("from_folders", []):
        _dist(side, dist, checkouts, moved, linked)
    if plugin is not None and PLUGIN not in side.expected:
        _module(side, PLUGIN, Path(os.path.realpath(plugin)), checkouts, moved, linked,
                "pytest-dlperf's rank side")
    if linked:
        links.mkdir(parents=True, exist_ok=True)
        for name, target in linked.items():
            link = links / (name if target.is_dir() else name + target.suffix)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target, target_is_directory=target.is_dir())
        side.import_paths.insert(0, str(links))
    return side


def _dist(side: Side, dist: dict[str, Any], checkouts: Checkouts,
          moved: list[tuple[Path, Path]], linked: dict[str, Path]) -> None:
    label = f"{dist['name']} {dist['version']}"
    if checkouts.where(dist["folder"]) is None:
        if dist["editable"]:
            side.same.append(f"{label}: editable from {dist['folder']}, outside the tests' "
                             "repository")
        return
    if not dist["editable"]:
        side.same.append(f"{label}: an installed copy (not editable) of {dist['folder']}")
        return
    for name, locations in sorted(dist["modules"].items()):
        _module(side, name, Path(locations[0]), checkouts, moved, linked,
                f"{name} ({label}, editable)")


def _module(side: Side, name: str, location: Path, checkouts: Checkouts,
            moved: list[tuple[Path, Path]], linked: dict[str, Path], label: str) -> None:
    """Module ``name``, found at ``location`` by the head's interpreter, from the side's tree."""
    found = checkouts.where(location)
    if found is None:
        return
    checkout, relative = found
    for folder, target in moved:  # on a folder of the path the side takes from its tree
        if location.is_relative_to(folder):
            side.expected[name] = str(target / location.relative_to(folder))
            side.taken.append(f"{label}: {relative.as_posix()}")
            _built(side, name, location, target / location.relative_to(folder))
            return
    target = side.tree / relative
    if checkout == side.tree:
        side.expected[name] = str(location)
        side.taken.append(f"{label}: {relative.as_posix()}")
        return
    if not target.exists():
        side.lacking.append(f"{name}: {relative.as_posix()} is not in this side's tree")
        return
    linked[name] = target
    side.expected[name] = str(target)
    side.taken.append(f"{label}: {relative.as_posix()}")
    _built(side, name, location, target)


def _built(side: Side, name: str, location: Path, target: Path) -> None:
    """Compiled files of the head's package that the side's tree lacks (built in the checkout,
    ignored by git): the side would import without them, or fail."""
    if not location.is_dir():
        return
    missing = []
    for folder, dirs, files in os.walk(location):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for file in files:
            if file.endswith(COMPILED):
                relative = Path(folder, file).relative_to(location)
                if not (target / relative).exists():
                    missing.append(relative.as_posix())
    if missing:
        shown = ", ".join(sorted(missing)[:3]) + (" ..." if len(missing) > 3 else "")
        side.lacking.append(f"{name}: built files this side's tree lacks ({shown}): build "
                            "it with --dlperf-ab-build")
