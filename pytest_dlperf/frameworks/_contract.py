"""What a framework adapter module is, as a typed protocol (``AdapterModule``) that mypy checks
the built-in adapters against, and the one shim through which a user's own adapter module meets
it (``adapter``).

A built-in adapter module defines every member of the protocol: the optional parts of
docs/adding-a-framework.md (``amp_unavailable``, ``compile_unavailable``, ``eager_unavailable``,
``INSTALL_HINT``, ``COMPILER``) included, each saying None where it has nothing to refuse. The
layout kinds it runs are the strategies it registers (``core/strategies.py``), not a member.

A user's own adapter may define only ``DISTRIBUTION`` and ``build_trainer``; ``UserAdapter``
supplies the rest as "nothing refused", its trainers' optional members as "none"
(``UserTrainer``: every ``Trainer`` member the rank calls, none probed there), and turns the module's ``layout_unavailable(kinds,
device_type)`` or ``layout_unavailable(kinds, device_type, compiled)`` function, written before
strategies existed, into a checked strategy for each kind beyond data parallelism. This shim is
the only place that asks a module what it defines.

Standard library only: ranks import it, under any Python 3.10+.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from ..core.kinds import BUILT_IN
from ..core.strategies import Checked, register_strategy, strategy_for

if TYPE_CHECKING:
    from ..core.spec import RankSpec
    from ..core.workload import BuildContext, Parts
    from . import DistEnv, Trainer


class AdapterModule(Protocol):
    """A framework adapter: the members docs/adding-a-framework.md describes."""

    @property
    def __name__(self) -> str: ...

    @property
    def DISTRIBUTION(self) -> str | tuple[str, ...]: ...  # noqa: N802 (a module constant)

    @property
    def RECIPE_FOR(self) -> str | None: ...  # noqa: N802

    @property
    def INSTALL_HINT(self) -> str | None: ...  # noqa: N802

    @property
    def COMPILER(self) -> str: ...  # noqa: N802

    def build_trainer(self, spec: RankSpec, dist: DistEnv,
                      recipe: Callable[[BuildContext], Parts] | None, /) -> Trainer: ...

    def amp_unavailable(self, device_type: str, /) -> str | None: ...

    def compile_unavailable(self, device_type: str, /) -> str | None: ...

    def eager_unavailable(self, device_type: str, /) -> str | None: ...


class UserAdapter:
    """A user's adapter module as an ``AdapterModule``: what it defines, and "nothing refused"
    for the optional parts it leaves out."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.__name__ = module.__name__
        self.DISTRIBUTION: str | tuple[str, ...] = module.DISTRIBUTION
        self.RECIPE_FOR: str | None = getattr(module, "RECIPE_FOR", None)
        self.INSTALL_HINT: str | None = getattr(module, "INSTALL_HINT", None)
        self.COMPILER: str = str(getattr(module, "COMPILER", "its compiler"))

    def build_trainer(self, spec: RankSpec, dist: DistEnv,
                      recipe: Callable[[BuildContext], Parts] | None, /) -> Trainer:
        return UserTrainer(self.module.build_trainer(spec, dist, recipe))

    def _asks(self, mode: str, device_type: str) -> str | None:
        check = getattr(self.module, f"{mode}_unavailable", None)
        return check(device_type) if check is not None else None

    def amp_unavailable(self, device_type: str, /) -> str | None:
        return self._asks("amp", device_type)

    def compile_unavailable(self, device_type: str, /) -> str | None:
        return self._asks("compile", device_type)

    def eager_unavailable(self, device_type: str, /) -> str | None:
        return self._asks("eager", device_type)


class UserTrainer:
    """A user's adapter's trainer as a whole ``Trainer``: its own members, and "none" for the
    optional ones it leaves out (a trainer written before they existed, or without a base of
    the plugin's). Asked once, here; the rank then calls every member directly."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.step, self.synchronize = trainer.step, trainer.synchronize
        self.loss, self.environment, self.close = trainer.loss, trainer.environment, trainer.close
        self._local_synchronize = getattr(trainer, "local_synchronize", trainer.synchronize)
        self._phase_plan = getattr(trainer, "phase_plan", None)
        self._reset = getattr(trainer, "reset_peak_memory", None)
        self._peak = getattr(trainer, "peak_memory", None)

    @property
    def local_step(self) -> Callable[[], None] | None:
        step: Callable[[], None] | None = getattr(self.trainer, "local_step", None)
        return step

    def local_synchronize(self) -> None:
        self._local_synchronize()

    def phase_plan(self) -> Any:
        return self._phase_plan() if self._phase_plan is not None else None

    def reset_peak_memory(self) -> None:
        if self._reset is not None:
            self._reset()

    def peak_memory(self) -> dict[str, int]:
        return dict(self._peak()) if self._peak is not None else {}


def adapter(module: ModuleType, name: str) -> AdapterModule:
    """``module`` (the adapter registered as ``name``) as an ``AdapterModule``: a built-in one as
    it is, a user's through ``UserAdapter``, its ``layout_unavailable`` function (if any) then
    the check of a strategy for each built-in kind beyond ``dp`` it has none registered for."""
    if module.__name__ == f"{__package__}.{name}":
        return module  # a built-in adapter: checked by mypy below, member by member
    check = getattr(module, "layout_unavailable", None)
    if check is not None:
        for kind in BUILT_IN[1:]:
            if strategy_for(name, kind) is None:
                register_strategy(name, Checked(kind, _three_arguments(check)))
    return UserAdapter(module)


def _three_arguments(check: Callable[..., Any]) -> Callable[[tuple[str, ...], str, bool],
                                                            str | None]:
    """A user's ``layout_unavailable`` as a three-argument check: the two-argument form (no
    ``compiled``) is asked the same whatever the mode."""
    takes_compiled = "compiled" in inspect.signature(check).parameters

    def three(kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        reason = (check(kinds, device_type, compiled=compiled) if takes_compiled
                  else check(kinds, device_type))
        return str(reason) if reason else None

    return three


if TYPE_CHECKING:  # mypy checks every built-in adapter module against the protocol
    from . import jax, mindspore, mxnet, oneflow, paddle, tensorflow, torch

    _jax: AdapterModule = jax
    _mindspore: AdapterModule = mindspore
    _mxnet: AdapterModule = mxnet
    _oneflow: AdapterModule = oneflow
    _paddle: AdapterModule = paddle
    _tensorflow: AdapterModule = tensorflow
    _torch: AdapterModule = torch
