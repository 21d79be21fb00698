"""Where training ranks import pytest-dlperf from: the very package the plugin runs, whatever
interpreter the ranks run under (``--dlperf-python``: OneFlow's Python 3.10 beside pytest's
3.11)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
# Folders that hold many installed packages, not a source tree of this one.
_INSTALLED = ("site-packages", "dist-packages")


def rank_import_path(scratch: Path, package: Path = PACKAGE) -> str:
    """The folder to put first on the ranks' ``PYTHONPATH``. A source tree's root as it is.
    From an installed copy (a wheel in site-packages), a folder under ``scratch`` holding only
    a link to the package: all of pytest's site-packages first on the path would shadow the
    ranks' own packages in another interpreter (OneFlow's Python 3.10 then imported the 3.11
    venv's numpy and failed). ``scratch`` must be where every node reads it (a launch's
    folder)."""
    parent = package.parent
    if parent.name not in _INSTALLED:
        return str(parent)
    linked = scratch / "dlperf-import"
    link = linked / package.name
    linked.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(package, target_is_directory=True)
    return str(linked)


def rank_pythonpath(scratch: Path, first: Sequence[str] | None = (),
                    inherited: str | None = None) -> str:
    """The ranks' ``PYTHONPATH``: ``first`` (the spec's ``import_paths``: an A/B side's own
    code, ``core.sources``), then this package (``rank_import_path``), then what pytest's
    environment had (``inherited``)."""
    return os.pathsep.join(p for p in (*(first or ()), rank_import_path(scratch), inherited)
                           if p)
