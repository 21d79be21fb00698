"""Strategies: how one framework runs one layout kind, registered per (framework, kind).

A framework runs a layout kind beyond plain data parallelism where a strategy for that
(framework, kind) is registered, and only there: ``Adapter.layout_unavailable`` asks each of
the layout's kinds' strategies ``why_not`` (a reason, or None) and refuses a kind with none,
naming the ones the framework has. The built-in adapters register theirs when their module is
imported (``frameworks/torch/parallel.py``: fsdp, tp, pp), a new kind's module registers its own
beside the kind (docs/adding-a-layout-kind.md).

A strategy that shards the model part by part is a ``PartStrategy``: the framework's trainer
calls ``apply_part_strategies`` on each part of the model it holds, which applies the layout's
kinds' part strategies in the layout's order. A part is a ``Part`` (the module, the recipe's
parts, the layout, the rank's spec, the strategies' notes), of the framework's own subclass
with what its strategies need beside it: torch's ``TorchPart`` here (the device mesh with the
kind's dimension), OneFlow's ``OneFlowPart`` and MXNet's ``MXNetPart`` in their adapters.
Two plain strategies say only what a framework cannot run: ``Checked`` asks a function of the
whole layout (an adapter's own check, or a user adapter's ``layout_unavailable`` through the
shim of ``frameworks/_contract.py``), and ``Unported`` records why a framework does not run a
kind at all, so its skip says more than "no strategy".

Standard library only: ranks import it, under any Python 3.10+.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from .parallel import Layout
    from .spec import RankSpec
    from .workload import Parts


class Strategy(Protocol):
    """That a framework runs ``kind``, and what of it it cannot (``why_not``)."""

    @property
    def kind(self) -> str: ...

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        """Why a layout of ``kinds`` (this one among them) cannot run on ``device_type``
        (``compiled``: under the framework's compiler), or None."""


@runtime_checkable
class PartStrategy(Strategy, Protocol):
    """A strategy the framework's trainer applies to each part of the model it holds."""

    def apply(self, part: Any) -> None:
        """Shard or wrap one part of the model, as this rank holds it (a ``Part`` of the
        framework's type: ``TorchPart`` for torch)."""


# A check of a whole layout: why a layout of these kinds cannot run on this device type
# (compiled: under the framework's compiler), or None.
LayoutCheck = Callable[[tuple[str, ...], str, bool], "str | None"]


@dataclass(frozen=True)
class Checked:
    """A kind the framework runs, with what it cannot said by ``check`` of the whole layout
    (the same check may serve several kinds: combinations are its business)."""

    kind: str
    check: LayoutCheck

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        return self.check(kinds, device_type, compiled)


def only_kind(kind: str, kinds: tuple[str, ...], runs: str) -> str | None:
    """Why a strategy that runs ``kind`` alone refuses a layout of ``kinds`` with another
    beside it (``runs``: what it runs, "the torch adapter splits a head beside a data-parallel
    backbone only"), or None."""
    if set(kinds) == {kind}:
        return None
    return f"{kind} beside another kind ({', '.join(k for k in kinds if k != kind)}): {runs}"


@dataclass(frozen=True)
class Unported:
    """A kind the framework does not run, and why (measured or read): its reason is the skip's,
    in place of the generic "no strategy"."""

    kind: str
    reason: str

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        return self.reason


@dataclass(frozen=True, kw_only=True)
class Part:
    """One part of the model as this rank holds it, what a ``PartStrategy``'s ``apply`` is given:
    ``module`` (the whole model, or one pipeline stage), the recipe's ``Parts``, the ``Layout``
    and the rank's ``RankSpec``; ``notes``, by kind, what a strategy sharded and where (said in
    the results' ``sharded_modules``). Each framework gives a subclass of its own, with what its
    strategies need beside these. Fields are keyword-only, so that a subclass adds its own."""

    module: Any
    parts: Parts
    layout: Layout
    spec: RankSpec
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TorchPart(Part):
    """What a torch strategy's ``apply`` is given: a ``Part`` (``module``: the whole model, or
    one pipeline stage), torch itself, the layout's ``DeviceMesh`` (``mesh[kind]`` is the kind's
    dimension); ``units``: the blocks of this part wrapped one by one (FSDP2's units, compiled
    one by one under torch.compile).

    What a strategy leaves for the step: ``averaged``, (parameters, process group) pairs whose
    gradients the step averages over the group after backward (the replicated part beside a
    sharded one, where no DDP wraps it); ``notes``, by kind, what it sharded and where (said in
    the results' ``sharded_modules``)."""

    torch: Any
    mesh: Any
    units: tuple[str, ...] = ()
    averaged: list[tuple[list[Any], Any]] = field(default_factory=list)


PartT = TypeVar("PartT", bound=Part)


def apply_part_strategies(framework: str, part: PartT,
                          kinds: Container[str] | None = None) -> PartT:
    """The part strategies ``framework`` has for the layout's kinds, each applied to ``part``
    in the layout's order (``kinds``: only those of them, where a trainer does something of its
    own between them); ``part`` back, with what the strategies left in it."""
    for kind in part.layout.kinds:
        strategy = strategy_for(framework, kind)
        if isinstance(strategy, PartStrategy) and (kinds is None or kind in kinds):
            strategy.apply(part)
    return part


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
    """The kinds ``framework`` runs: those with a strategy registered that is not ``Unported``."""
    return tuple(kind for (fw, kind), strategy in _STRATEGIES.items()
                 if fw == framework and not isinstance(strategy, Unported))


def why_not(framework: str, kinds: tuple[str, ...], device_type: str,
            compiled: bool = False) -> str | None:
    """Why ``framework`` cannot run a layout of ``kinds`` on ``device_type``, or None: a kind
    with no strategy (plain data parallelism, ``dp``, is every framework's and needs none), or
    what a kind's strategy says."""
    for kind in kinds:
        if kind != "dp" and strategy_for(framework, kind) is None:
            has = kinds_of(framework)
            return (f"the {framework} adapter has no strategy for layout kind {kind!r} ("
                    + (f"it runs dp, {', '.join(has)}" if has else "it runs data parallelism "
                       "only") + "): register one (docs/adding-a-layout-kind.md)")
    for kind in kinds:
        strategy = strategy_for(framework, kind)
        why = strategy.why_not(kinds, device_type, compiled) if strategy is not None else None
        if why:
            return str(why)
    return None
