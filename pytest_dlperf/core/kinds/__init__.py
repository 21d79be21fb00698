"""Layout kinds, each a registered entry (``registry``: the entry, its registration, the four
built-in kinds), and the plugin's own kinds beyond them, each a module that registers it the way
a kind of one's own is registered (docs/adding-a-layout-kind.md): ``emb`` (embedding tables
sharded by a plan), then ``pfc`` (a classifier's head split by class). Importing the registry
imports this package first, so every process that reads a layout knows all of them, registered
in this order: the order of terms in case ids.

Standard library only: ranks import it, under any Python 3.10+.
"""

from __future__ import annotations

from . import emb, pfc  # noqa: F401  (register emb, then pfc, after the built-in kinds)
from .registry import (
    BUILT_IN,
    DEFAULT_SCHEDULE,
    KINDS,
    MESH_ORDER,
    SCHEDULES,
    Kind,
    LayoutError,
    carried,
    kind_of,
    mesh_order,
    register_kind,
    registered,
    unregister_kind,
)

__all__ = ["BUILT_IN", "DEFAULT_SCHEDULE", "KINDS", "MESH_ORDER", "SCHEDULES", "Kind",
           "LayoutError", "carried", "kind_of", "mesh_order", "register_kind", "registered",
           "unregister_kind"]
