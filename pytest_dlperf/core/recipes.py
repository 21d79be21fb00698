"""How ranks find a workload's recipe: a ``module:function`` reference made on the pytest side
(``recipe_reference`` refuses what other processes cannot import, before launch) and imported
inside each rank (``load_recipe``, which also checks the recipe returns ``Parts``). Standard
library only: ranks import it, under any Python 3.10+.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .workload import BuildContext, Parts, Recipe, WorkloadError


@dataclass(frozen=True)
class RecipeReference:
    """Where a rank finds a recipe: ``module:qualname``, and the folder to put on ``sys.path``
    first (None when the module is importable as installed)."""

    module: str
    qualname: str
    path: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.module}:{self.qualname}"


def recipe_reference(recipe: Recipe, what: str) -> RecipeReference:
    """How ranks will import ``recipe``; a ``WorkloadError`` saying why when they cannot."""
    if isinstance(recipe, str):
        path, sep, name = recipe.partition(":")
        if not sep or not path or not name:
            raise WorkloadError(f"{what}: {recipe!r} is not a 'module:function' path")
        return RecipeReference(path, name)
    if not callable(recipe):
        raise WorkloadError(f"{what}: expected a function or a 'module:function' path, got "
                            f"{type(recipe).__name__}")
    module_name: str | None = getattr(recipe, "__module__", None)
    qualname: str | None = getattr(recipe, "__qualname__", None)
    if not module_name or not qualname:
        raise WorkloadError(f"{what}: {recipe!r} has no module and name to import it by; "
                            "define the recipe with def at the top level of a module")
    if qualname == "<lambda>" or "<lambda>" in qualname:
        raise WorkloadError(f"{what}: a lambda cannot be a recipe: every rank imports the "
                            "recipe by module and name, and a lambda has no name to import; "
                            "define it with def at the top level of the test module")
    if "<locals>" in qualname:
        raise WorkloadError(f"{what}: {qualname} is defined inside another function, so ranks "
                            "cannot import it; move it to the top level of its module")
    if module_name == "__main__":
        raise WorkloadError(f"{what}: {qualname} lives in __main__, which other processes "
                            "cannot import; put it in a module (the test file itself will do)")
    module = sys.modules.get(module_name)
    if module is None or _lookup(module, qualname) is not recipe:
        raise WorkloadError(f"{what}: {module_name}:{qualname} does not name this function "
                            "(rebound or generated?); define it with def at module level")
    return RecipeReference(module_name, qualname, import_root(module))


def _lookup(module: ModuleType, qualname: str) -> Any:
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
    return target


def import_root(module: ModuleType) -> str | None:
    """The folder that makes ``module`` importable by its name (pytest's rootdir-based import
    puts the test file's first folder without an ``__init__.py`` on ``sys.path``; the ranks do
    not inherit it); None when its file is not below such a folder (an installed module)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    parts = module.__name__.split(".")
    package = path.name == "__init__.py"
    levels = len(parts) if package else len(parts) - 1
    root = path.parent
    for _ in range(levels):
        root = root.parent
    expected = (root.joinpath(*parts, "__init__.py") if package
                else root.joinpath(*parts[:-1], parts[-1] + path.suffix))
    if expected != path:
        raise WorkloadError(
            f"module {module.__name__} ({path}) is not importable under that name from any "
            "folder (pytest's importlib import mode?); ranks import recipes by module path: "
            "use the default import mode, or put the recipe in an importable module")
    return str(root)


def load_recipe(reference: RecipeReference) -> Callable[[BuildContext], Parts]:
    """Import a recipe inside a rank."""
    if reference.path and reference.path not in sys.path:
        sys.path.insert(0, reference.path)
    try:
        module = importlib.import_module(reference.module)
    except ImportError as exc:
        where = f" (looked in {reference.path} first)" if reference.path else ""
        raise WorkloadError(f"cannot import the recipe module {reference.module}{where}: {exc}; "
                            "every rank must be able to import it (on a cluster: a shared "
                            "file system, or the module installed on every node)") from exc
    recipe = _lookup(module, reference.qualname)
    if not callable(recipe):
        raise WorkloadError(f"{reference.ref} is not a function in {module.__file__}")
    return _checked(recipe, reference)


def _checked(recipe: Callable[[BuildContext], Any],
             reference: RecipeReference) -> Callable[[BuildContext], Parts]:
    """``recipe`` that raises a ``WorkloadError`` naming it when it returns anything but
    ``Parts``: here, once, so that every adapter gets it (else a tuple fails deep inside one as
    "'tuple' object has no attribute 'model'")."""

    @functools.wraps(recipe)
    def call(ctx: BuildContext) -> Parts:
        parts = recipe(ctx)
        if not isinstance(parts, Parts):
            what = type(parts).__name__
            if isinstance(parts, (tuple, list, dict)):
                what += f" (of {len(parts)})"
            raise WorkloadError(
                f"the recipe {reference.ref} returned a {what}, not Parts: a recipe must "
                "return pytest_dlperf.Parts(model=..., inputs=..., targets=...) (or "
                "Parts(model=..., data=...) to measure an input pipeline)")
        return parts

    return call
