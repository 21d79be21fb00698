"""The built-in workloads, a package per model: its face (``models/<model>/__init__.py``) holds the
workload (sizes, optimizer, FLOPs, the recipe per framework by module path), which the pytest side
imports; a module per framework beside it (``models/<model>/<framework>.py``) holds that
framework's recipe, imported by that framework's ranks only.

``measure(framework, "resnet50")`` looks a name up here; users pass their own ``Workload``.
"""

from __future__ import annotations

from ..core.workload import Workload
from .bert import WORKLOAD as BERT_BASE
from .gpt import WORKLOAD as GPT
from .insightface import WORKLOAD as INSIGHTFACE
from .resnet50 import WORKLOAD as RESNET50
from .wide_deep import WORKLOAD as WIDE_DEEP

__all__ = ["BERT_BASE", "BUILTIN", "GPT", "INSIGHTFACE", "RESNET50", "WIDE_DEEP", "builtin",
           "with_recipe"]

BUILTIN: dict[str, Workload] = {w.name: w for w in (RESNET50, BERT_BASE, GPT, WIDE_DEEP,
                                                     INSIGHTFACE)}


def with_recipe(key: str) -> list[str]:
    """The built-in models that have a recipe for ``key`` (a framework)."""
    return sorted(name for name, workload in BUILTIN.items() if key in workload.recipes)


def builtin(name: str, framework: str, key: str | None) -> Workload:
    """The built-in model ``name``, as ``framework`` (whose recipes are ``key``'s) asks for it."""
    if name in BUILTIN:
        return BUILTIN[name]
    has = with_recipe(key) if key else sorted(BUILTIN)
    raise LookupError(f"{framework} has no model {name!r} (has: {', '.join(has) or 'none'}); "
                      "for your own model pass a pytest_dlperf.Workload instead of a name")
