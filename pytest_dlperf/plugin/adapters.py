"""Which framework adapter a case uses, seen from the pytest side: its installed version (read
from package metadata, in pytest's interpreter or the ranks' own), the recipe it builds from,
how to install it, and whether it can run AMP or a compiled step on this device. The adapter
module is looked up once per case (``Adapter.resolve``) and asked everything from there.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import subprocess
from dataclasses import dataclass
from types import ModuleType

from .. import frameworks
from ..core.kinds import BUILT_IN
from ..core.recipes import RecipeReference, import_root, recipe_reference
from ..core.strategies import kinds_of, strategy_for
from ..core.workload import Workload, WorkloadError
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
    module: ModuleType

    @classmethod
    def resolve(cls, name: str) -> Adapter:
        """The adapter for ``name``; a ``LookupError`` naming the known ones otherwise."""
        return cls(name, frameworks.load(name))

    @property
    def import_root(self) -> str | None:
        """Where ranks import a user's own adapter from (the folder pytest imported it
        from); None for a built-in one, or where it cannot be told (the ranks then import it
        as installed, or from their working directory)."""
        if self.module.__name__.startswith(f"{frameworks.__name__}."):
            return None
        try:
            return import_root(self.module)
        except WorkloadError:
            return None

    @property
    def recipe_key(self) -> str | None:
        """Which recipes it builds from (None: it trains on its own)."""
        return getattr(self.module, "RECIPE_FOR", None)

    @property
    def distributions(self) -> tuple[str, ...]:
        found = self.module.DISTRIBUTION
        return (found,) if isinstance(found, str) else tuple(found)

    @property
    def install_hint(self) -> str:
        """How to install the framework, as its adapter says (default: this package's extra)."""
        hint = getattr(self.module, "INSTALL_HINT", None)
        return str(hint) if hint else f"install it (pip install 'pytest-dlperf[{self.name}]')"

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
        the adapter's optional ``amp_unavailable`` / ``eager_unavailable`` /
        ``compile_unavailable`` says; None: it can."""
        check = getattr(self.module, f"{mode}_unavailable", None)
        return check(device_type) if check is not None else None

    def layout_unavailable(self, kinds: tuple[str, ...], device_type: str,
                           compiled: bool = False) -> str | None:
        """Why a layout of ``kinds`` (``Layout.kinds``: "fsdp", "tp", "pp") cannot run on
        ``device_type`` (``compiled``: under the adapter's compiler), as the adapter's optional
        ``layout_unavailable(kinds, device_type[, compiled])`` says; an adapter without it runs
        plain data parallelism only."""
        # A kind beyond the built-in ones runs where a strategy for it is registered
        # (core/strategies.py), and only there; the strategy says what it cannot.
        added = [kind for kind in kinds if kind not in BUILT_IN]
        for kind in added:
            if strategy_for(self.name, kind) is None:
                has = kinds_of(self.name)
                return (f"the {self.name} adapter has no strategy for layout kind {kind!r}"
                        + (f" (it has: {', '.join(has)})" if has else "")
                        + ": register one (docs/adding-a-layout-kind.md)")
        built_in = tuple(kind for kind in kinds if kind in BUILT_IN)
        if built_in and built_in != ("dp",):
            check = getattr(self.module, "layout_unavailable", None)
            if check is None:
                return (f"the {self.name} adapter runs data parallelism only (it defines no "
                        "layout_unavailable: docs/adding-a-framework.md)")
            takes_compiled = "compiled" in inspect.signature(check).parameters
            reason = (check(built_in, device_type, compiled=compiled) if takes_compiled
                      else check(built_in, device_type))
            if reason:
                return str(reason)
        for kind in added:
            strategy = strategy_for(self.name, kind)
            assert strategy is not None
            why = strategy.why_not(tuple(kinds), device_type, compiled)
            if why:
                return str(why)
        return None


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
