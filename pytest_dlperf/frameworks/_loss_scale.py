"""Dynamic loss scaling (fp16 AMP: CUDA's), one policy for every framework: the same algorithm
in each, only the system differs.

Each framework that scales its loss builds its own dynamic scaler from ``POLICY`` (torch's and
Paddle's ``GradScaler``, OneFlow's for ``nn.Graph``, MindSpore's ``DynamicLossScaler``, Keras's
``LossScaleOptimizer``, MXNet's AMP loss scaler); their defaults differ (Keras's starts at
2^15, the others at 2^16), so none is left to its own. Where a framework
has no dynamic scaler for a kind of step (OneFlow 0.9.0's configures ``nn.Graph`` only), the
policy is run by hand (``DynamicScale``), as torch's ``GradScaler`` runs it.

Runs inside a rank, under any interpreter: the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossScalePolicy:
    """Start the scale at ``initial``; a step whose gradients hold an inf or NaN is skipped and
    the scale multiplied by ``backoff``; after ``interval`` clean steps in a row it is multiplied
    by ``growth`` (torch's ``GradScaler`` defaults)."""

    initial: float = 2.0 ** 16
    growth: float = 2.0
    backoff: float = 0.5
    interval: int = 2000


POLICY = LossScalePolicy()


class DynamicScale:
    """The policy's scale, step by step, for a framework that has no scaler of its own: the
    caller multiplies the loss by ``scale`` before backward, the gradients by ``1 / scale``
    after, and reports whether they were all finite (``update``), which says whether to step."""

    def __init__(self, policy: LossScalePolicy = POLICY) -> None:
        self.policy = policy
        self.scale = policy.initial
        self._clean_steps = 0

    def update(self, finite: bool) -> bool:
        """The next step's scale from this step's gradients; whether this step may update."""
        if not finite:
            self.scale *= self.policy.backoff
            self._clean_steps = 0
            return False
        self._clean_steps += 1
        if self._clean_steps == self.policy.interval:
            self.scale *= self.policy.growth
            self._clean_steps = 0
        return True
