"""Which framework adapter a case uses, seen from the pytest side: its installed version (read
from package metadata, in pytest's interpreter or the ranks' own), the recipe it builds from,
how to install it, and whether it can run AMP or a compiled step on this device. The adapter
module is looked up once per case (``Adapter.resolve``) and asked everything from there.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from dataclasses import dataclass

from .. import frameworks
from ..core import strategies
from ..core.recipes import RecipeReference, import_root, recipe_reference
from ..core.workload import Workload, WorkloadError
from ..frameworks._contract import AdapterModule, adapter
from ..models import with_recipe

# Prints the version of the first of its arguments that is installed, in another interpreter.
_PROBE = """
import importlib.metadata as m, sys
for name in sys.argv[1:]:
    try:
        print(m.version(name)); break
    except m.PackageNotFoundError:
        pass
"""


@dataclass(frozen=True)
class Adapter:
    """A framework adapter module (``frameworks/<name>.py``, or a user's dotted module)."""

    name: str
    module: AdapterModule

    @classmethod
    def resolve(cls, name: str) -> Adapter:
        """The adapter for ``name``; a ``LookupError`` naming the known ones otherwise. A
        user's adapter goes through the shim of ``frameworks/_contract.py``."""
        return cls(name, adapter(frameworks.load(name), name))

    @property
    def import_root(self) -> str | None:
        """Where ranks import a user's own adapter from (the folder pytest imported it
        from); None for a built-in one, or where it cannot be told (the ranks then import it
        as installed, or from their working directory)."""
        if self.module.__name__.startswith(f"{frameworks.__name__}."):
            return None
        try:
            return import_root(sys.modules[self.module.__name__])
        except WorkloadError:
            return None

    @property
    def recipe_key(self) -> str | None:
        """Which recipes it builds from (None: it trains on its own)."""
        return self.module.RECIPE_FOR

    @property
    def distributions(self) -> tuple[str, ...]:
        found = self.module.DISTRIBUTION
        return (found,) if isinstance(found, str) else tuple(found)

    @property
    def install_hint(self) -> str:
        """How to install the framework, as its adapter says (default: this package's extra)."""
        hint = self.module.INSTALL_HINT
        return hint if hint else f"install it (pip install 'pytest-dlperf[{self.name}]')"

    def recipe_for(self, workload: Workload) -> RecipeReference | None:
        """The reference of ``workload``'s recipe for this adapter, checked on the pytest side
        before any launch; None for an adapter that trains without recipes. A ``LookupError``
        names what exists when there is no recipe for it."""
        key = self.recipe_key
        if key is None:
            return None
        recipe = workload.recipes.get(key)
        if recipe is None:
            builtin = with_recipe(key)
            raise LookupError(
                f"{self.name} has no model {workload.name!r}: that workload has recipes for "
                f"{', '.join(sorted(workload.recipes))} only (built-in models with a {key} "
                f"recipe: {', '.join(builtin) or 'none'}); add recipes={{{key!r}: your_function}}")
        return recipe_reference(recipe, f"workload {workload.name!r}, {key} recipe")

    def installed_version(self, python: str | None = None) -> str | None:
        """The framework's installed version from package metadata (no framework import), in
        this interpreter or in ``python``'s; the first of ``DISTRIBUTION`` installed wins."""
        if python is not None:
            return _version_in(python, self.distributions)
        for distribution in self.distributions:
            try:
                return importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None

    def unavailable(self, mode: str, device_type: str) -> str | None:
        """Why ``mode`` ("amp", "eager" or "compile") cannot run on ``device_type`` here, as
        the adapter's ``amp_unavailable`` / ``eager_unavailable`` / ``compile_unavailable``
        says; None: it can."""
        checks = {"amp": self.module.amp_unavailable, "eager": self.module.eager_unavailable,
                  "compile": self.module.compile_unavailable}
        return checks[mode](device_type)

    def layout_unavailable(self, kinds: tuple[str, ...], device_type: str,
                           compiled: bool = False) -> str | None:
        """Why a layout of ``kinds`` (``Layout.kinds``) cannot run on ``device_type``
        (``compiled``: under the adapter's compiler): a kind beyond ``dp`` runs where a
        strategy for it is registered (core/strategies.py), and only there."""
        return strategies.why_not(self.name, kinds, device_type, compiled)


def _version_in(python: str, distributions: tuple[str, ...]) -> str | None:
    try:
        done = subprocess.run([python, "-c", _PROBE, *distributions], capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"cannot run {python}: {exc}") from None
    if done.returncode != 0:
        raise RuntimeError(f"{python} failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-500:]}")
    return done.stdout.strip() or None
