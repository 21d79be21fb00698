"""Strategies: how one framework runs one layout kind, registered per (framework, kind).

A kind beyond the built-in four (``pytest_dlperf.core.kinds``) runs on a framework where a
strategy for it is registered, and only there: ``Adapter.layout_unavailable`` asks the
strategy's ``why_not`` (a reason, or None), and the framework's trainer calls its ``apply`` on
each part of the model it holds, after its own kinds are applied. What ``apply`` is given is the
framework's: torch's is a ``TorchPart`` (the module, the device mesh with the kind's dimension,
the recipe's parts, the layout, the rank's spec). Register a kind and its strategies in one
module, which ranks import (the kind's ``module``): docs/adding-a-layout-kind.md.

Standard library only: ranks import it, under any Python 3.10+.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Strategy(Protocol):
    """How a framework runs ``kind``: what it cannot (``why_not``) and how (``apply``)."""

    kind: str

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        """Why a layout of ``kinds`` (this one among them) cannot run on ``device_type``
        (``compiled``: under the framework's compiler), or None."""

    def apply(self, part: Any) -> None:
        """Shard or wrap one part of the model, as this rank holds it (the framework's type:
        ``TorchPart`` for torch)."""


@dataclass(frozen=True)
class TorchPart:
    """What a torch strategy's ``apply`` is given: one part of the model (the whole model, or
    one pipeline stage), the layout's ``DeviceMesh`` (``mesh[kind]`` is the kind's dimension),
    the recipe's ``Parts``, the ``Layout`` and the rank's ``RankSpec``."""

    torch: Any
    module: Any
    mesh: Any
    parts: Any
    layout: Any
    spec: Any


_STRATEGIES: dict[tuple[str, str], Strategy] = {}


def register_strategy(framework: str, strategy: Strategy) -> Strategy:
    """Let ``framework`` run ``strategy.kind``. Another strategy for the same pair is an error."""
    key = (framework, strategy.kind)
    known = _STRATEGIES.get(key)
    if known is not None and known is not strategy and type(known) is not type(strategy):
        raise ValueError(f"a {framework} strategy for layout kind {strategy.kind!r} is "
                         f"registered already ({type(known).__name__})")
    _STRATEGIES[key] = strategy
    return strategy


def unregister_strategy(framework: str, kind: str) -> None:
    _STRATEGIES.pop((framework, kind), None)


def strategy_for(framework: str, kind: str) -> Strategy | None:
    return _STRATEGIES.get((framework, kind))


def kinds_of(framework: str) -> tuple[str, ...]:
    """The kinds beyond the built-in ones that ``framework`` has a strategy for."""
    return tuple(kind for fw, kind in _STRATEGIES if fw == framework)
