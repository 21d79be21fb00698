"""The registry of layout kinds, each a registered entry: how layouts spell it, where its
dimension sits in the device mesh, whether its ranks train on batches of their own, and which
term options it takes. The four built-in kinds (``dp``, ``fsdp``, ``tp``, ``pp``) are registered
here; the plugin's own further kinds register themselves in their modules beside this one
(``emb``, ``pfc``), the way a kind of one's own does (``register_kind``;
docs/adding-a-layout-kind.md).

Standard library only: ranks import it, under any Python 3.10+.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class LayoutError(ValueError):
    """A layout that cannot be spelled or does not fit the world; the message says which and
    what would."""


SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")
DEFAULT_SCHEDULE = "1f1b"


@dataclass(frozen=True)
class Kind:
    """A way of sharing the work, registered once (``register_kind``): how layouts spell it, where
    its dimension sits in the device mesh, and whether its ranks train on batches of their own.

    ``name``: the term's letters (``fsdp``; no ``x``, digit or ``-``: terms are joined by ``x`` and
    take a degree). ``mesh_position``: outermost first (torchtitan's order: pipeline stages
    furthest apart, tensor parallelism within a node's fastest links). ``data``: its ranks train
    on batches of their own (dp, fsdp), so the global batch grows with its degree; else they
    share one replica's batch (tp, pp). ``check_option``: why a term option (``r0.1`` in
    ``pfc2-r0.1``) is not one this kind takes, or None; a kind without it takes none. The options
    a layout was spelled with are in its id (and so in the fingerprint) and in ``options``."""

    name: str
    mesh_position: float
    data: bool
    check_option: Callable[[str], str | None] | None = None
    help: str = ""
    carried: bool = False  # learnt from a layout's JSON in a rank (``carried``)
    # A term of it names exactly one option (``emb2-tw``: its plan); what
    # ``check_option("")`` says is the message's list of them.
    needs_option: bool = False
    # A term of it names at most this many options (``pfc2-r0.1``: one ratio); None: any.
    max_options: int | None = None
    # The module that registered it (and its strategies), and the folder it imports from: a
    # rank imports it when its layout names the kind (``carried``). Filled by ``register_kind``.
    module: str = ""
    path: str = ""


_KINDS: dict[str, Kind] = {}  # registration order: the order of terms in a case id
BUILT_IN = ("dp", "fsdp", "tp", "pp")


def register_kind(kind: Kind) -> Kind:
    """Make ``kind`` spellable in layouts (``--dlperf-layouts``, the ``layouts`` marker). The
    same entry registered again is a no-op; another one under a taken name is an error. The
    calling module is recorded as the kind's (``Kind.module``): ranks import it to find the
    kind's strategies."""
    if not kind.module and not kind.carried and kind.name not in BUILT_IN:
        caller = sys._getframe(1).f_globals
        file = caller.get("__file__")
        kind = dataclasses.replace(kind, module=str(caller.get("__name__", "")), path=str(
            Path(file).resolve().parent) if file else "")
    if not re.fullmatch(r"[a-wyz]+", kind.name):
        raise LayoutError(f"layout kind {kind.name!r}: a kind's name is lower-case letters other "
                          "than 'x' (terms are joined by 'x' and end in a degree)")
    known = _KINDS.get(kind.name)
    if known is not None and known != kind and not known.carried:
        raise LayoutError(f"layout kind {kind.name!r} is registered already ({known.help or known})")
    if known is not None and known.carried and (known.mesh_position, known.data) != (
            kind.mesh_position, kind.data):
        raise LayoutError(f"layout kind {kind.name!r}: the layout this rank was given describes "
                          f"it otherwise ({known}); register it alike everywhere")
    _KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Forget a kind registered by ``register_kind`` (a test's, at its teardown); the built-in
    ones stay."""
    if name in BUILT_IN:
        raise LayoutError(f"layout kind {name!r} is built in and stays registered")
    _KINDS.pop(name, None)


def carried(name: str, mesh_position: float, data: bool, module: str = "",
            path: str = "") -> Kind:
    """A kind a rank learns from its layout's JSON (``Layout.to_json`` carries the entries of
    kinds beyond the built-in ones): registered where the rank has none of that name, then the
    module that registered it in pytest's process imported (from ``path``), which registers it
    again with its strategies. Options were checked there; a rank takes them as spelled."""
    known = _KINDS.get(name)
    if known is None:
        register_kind(Kind(name, mesh_position, data, _any_option, carried=True,
                           help="carried by a layout's JSON", module=module, path=path))
        if module:
            _import(module, path)
        known = _KINDS[name]
    if (known.mesh_position, known.data) != (mesh_position, data):
        raise LayoutError(f"layout kind {name!r}: the layout describes it as mesh position "
                          f"{mesh_position}, data {data}, and this process registered {known}")
    return known


def _import(module: str, path: str) -> None:
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise LayoutError(f"this rank cannot import {module!r} (from {path or 'sys.path'}), "
                          f"the module that registered its layout's kinds: {exc}") from exc


def _any_option(option: str) -> None:
    return None


def registered() -> tuple[str, ...]:
    """The registered kinds' names, built-in ones first."""
    return tuple(_KINDS)


def kind_of(name: str) -> Kind:
    try:
        return _KINDS[name]
    except KeyError:
        raise LayoutError(f"unknown layout kind {name!r}; the registered kinds are "
                          f"{', '.join(_KINDS)}") from None


def mesh_order() -> tuple[str, ...]:
    """The registered kinds in the order of a mesh's dimensions, outermost first."""
    return tuple(sorted(_KINDS, key=lambda name: _KINDS[name].mesh_position))


def _pipeline_option(option: str) -> str | None:
    if option in SCHEDULES or re.fullmatch(r"mb\d+", option) and int(option[2:]) > 0:
        return None
    return f"a schedule: {', '.join(SCHEDULES)}; micro-batches: mb<N>"


register_kind(Kind("dp", 1, True, help="replicated data parallelism (DDP)"))
register_kind(Kind("fsdp", 2, True, help="sharded data parallelism (FSDP2, ZeRO-3)"))
register_kind(Kind("tp", 3, False, help="tensor parallelism (Megatron-style)"))
register_kind(Kind("pp", 0, False, _pipeline_option, help="pipeline parallelism"))

# The built-in kinds, in the order their terms appear in ids, and the order of their mesh
# dimensions (what code that names them directly iterates over).
KINDS = BUILT_IN
MESH_ORDER = ("pp", "dp", "fsdp", "tp")
