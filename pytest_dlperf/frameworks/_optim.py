"""The workload's optimizer where the frameworks differ only in spelling, written once: which
kind it is (``build``: each adapter spells every kind, and an unknown one is refused in the
same words), which parameters take weight decay (``decay_split``, ``decay_groups``: the rule
is ``OptimizerSpec.decays``, the shape's; a framework is told it as groups, names, a mask or
a per-parameter multiplier), and torch's AdamW run by a fused Adam kernel that has no bias
correction (``kernel_epsilon``, ``kernel_rates``, ``decay_factor``: MindSpore's and MXNet's).

What stays in each adapter is what is not spelling: torch's fused kernels and their groups by
tensor class, Keras' optimizer API (its own decay, its cross-replica sum switched off),
OneFlow's ``nn.Graph`` (clipping and exclusions inside the optimizer), Paddle's clip inside the
optimizer, MindSpore's optimizer a compiled ``nn.Optimizer``, MXNet's ``wd_mult``, Optax's
chains and masks.

Runs inside a rank, under any interpreter: the standard library only; where the arithmetic
runs on a framework's tensors, its operator is passed in (``sqrt``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..core.spec import OptimizerSpec

T = TypeVar("T")
P = TypeVar("P")

KINDS = ("sgd", "adamw")  # the optimizer kinds a workload may name (core/workload.py)


def build(framework: str, opt: OptimizerSpec, *, sgd: Callable[[], T],
          adamw: Callable[[], T]) -> T:
    """The workload's optimizer: the adapter's spelling of ``opt.kind``, called. A kind added
    to ``KINDS`` is a keyword here, which every adapter must then spell (mypy says which do
    not); a spec naming no known kind is refused naming the adapter and the kinds it has."""
    builders = {"sgd": sgd, "adamw": adamw}
    if opt.kind not in builders:
        raise ValueError(f"the {framework} adapter has no optimizer {opt.kind!r} "
                         f"(has: {', '.join(KINDS)})")
    return builders[opt.kind]()


def _shape(param: Any) -> Any:
    return param.shape


def decay_split(params: Iterable[P], opt: OptimizerSpec,
                shape: Callable[[P], Any] = _shape) -> tuple[list[P], list[P]]:
    """``params`` as (those that take weight decay, those exempt), each in parameter order:
    ``opt.decays`` of the whole shape (BERT's "not on biases and LayerNorm" is 1-D; a shard's
    shape would mislead)."""
    decayed: list[P] = []
    exempt: list[P] = []
    for param in params:
        (decayed if opt.decays(shape(param)) else exempt).append(param)
    return decayed, exempt


def decay_groups(params: Iterable[Any], opt: OptimizerSpec) -> list[dict[str, Any]]:
    """Optimizer parameter groups (torch's, OneFlow's eager ones): the decayed parameters at
    the workload's rate, the exempt ones at 0, an empty group left out (an optimizer refuses
    one)."""
    decayed, exempt = decay_split(params, opt)
    groups = [{"params": decayed, "weight_decay": opt.weight_decay},
              {"params": exempt, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


# -- torch's AdamW on a fused Adam kernel without bias correction ------------------------------
#
# torch steps ``p *= 1 - lr * wd`` (the decay reads the weight before the step), then
# ``p -= lr * (m / c1) / (sqrt(v / c2) + eps)`` with ``c1 = 1 - beta1^t``, ``c2 = 1 - beta2^t``.
# A kernel that runs ``p -= lr' * m / (sqrt(v) + eps')`` (MXNet's ``adam_update``; MindSpore's
# ``Adam`` with ``lr' = lr * sqrt(1 - beta2^t) / (1 - beta1^t)`` computed inside) gives torch's
# step, exactly, with ``lr' = lr * sqrt(c2) / c1`` and ``eps' = eps * sqrt(c2)``: epsilon where
# torch adds it, outside the square root of the corrected second moment.


def decay_factor(lr: Any, weight_decay: Any) -> Any:
    """What the weight is multiplied by before the step: torch's decoupled decay, scaled by
    the rate (floats, or a framework's tensors)."""
    return 1 - lr * weight_decay


def kernel_epsilon(eps: Any, beta2_power: Any, sqrt: Callable[[Any], Any] = math.sqrt) -> Any:
    """The kernel's epsilon for torch's, ``eps * sqrt(1 - beta2^t)``, from ``beta2^t``
    (floats, or a framework's tensors with its ``sqrt``)."""
    return eps * sqrt(1.0 - beta2_power)


def kernel_rates(lr: float, beta1: float, beta2: float, eps: float,
                 step: int) -> tuple[float, float]:
    """The kernel's rate and epsilon at ``step`` (from 1) for torch's step at ``lr`` and
    ``eps``, where the kernel takes them as numbers (MXNet's)."""
    c1, c2 = 1 - beta1 ** step, 1 - beta2 ** step
    return lr * math.sqrt(c2) / c1, kernel_epsilon(eps, beta2 ** step)
