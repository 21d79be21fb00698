"""One training step, written once: the batch, the forward pass to the loss, backward from it,
and the update (loss scaling undone, the gradients clipped, the optimizer's step), as four
methods a trainer fills in (``EagerStep``). The timed step (``step``) and the diagnostic step cut
into phases (``phases``, a ``PhasePlan``'s) are the same four calls in the same order: they
cannot disagree, and the phases measure the code the windows timed.

A trainer whose framework runs the step as one compiled program (a graph with the optimizer
inside: OneFlow's nn.Graph, MindSpore's GRAPH mode, TensorFlow's tf.function, JAX's jit) has no
such four calls to time apart: its phases are merged (``core.phases.merged``) and it writes its
own ``step``.

Runs inside a rank, under any interpreter: the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import PhasePlan, step_phases


class OnRuntime:
    """A trainer's view of its rank's runtime (``frameworks/<framework>/runtime.py``): what the
    phase modules and the step read from the trainer (``cuda``, ``device``, ``threads``) is the
    runtime's own, not a copy; waiting for the device and tearing the process group down are
    the runtime's (a trainer whose wait also reads its last step's outputs says so itself)."""

    runtime: Any

    @property
    def cuda(self) -> bool:
        return bool(self.runtime.cuda)

    @property
    def device(self) -> Any:
        return self.runtime.device

    @property
    def threads(self) -> int:
        return int(self.runtime.threads)

    def synchronize(self) -> None:
        self.runtime.synchronize()

    def close(self) -> None:
        self.runtime.close()

    # -- the ``Trainer`` protocol's optional members, answered "none" -----------------------

    @property
    def local_step(self) -> Callable[[], None] | None:
        return None

    def local_synchronize(self) -> None:
        self.synchronize()

    def phase_plan(self) -> PhasePlan | None:
        return None

    def reset_peak_memory(self) -> None:
        return None

    def peak_memory(self) -> dict[str, int]:
        return {}


class RuntimePeaks:
    """A trainer whose runtime reads the device allocator's peaks (torch's, Paddle's and
    TensorFlow's CUDA counters): the trainer's peaks are the runtime's. Named before its
    ``OnRuntime`` base, whose "none" it answers instead."""

    runtime: Any

    def reset_peak_memory(self) -> None:
        self.runtime.reset_peak_memory()

    def peak_memory(self) -> dict[str, int]:
        return dict(self.runtime.peak_memory())


class EagerStep(OnRuntime):
    """A trainer whose step is ``_next_batch``, ``_forward``, ``_backward`` and ``_update``,
    called in that order (torch's, Paddle's and MXNet's eager and hybrid steps):

    - ``_next_batch() -> (inputs, targets)`` on the device;
    - ``_forward(inputs, targets) -> loss``, also kept where the trainer's ``loss()`` reads it;
    - ``_backward(loss)``: backward, loss scaling applied, the data-parallel gradients averaged
      where the framework does it in backward (DDP's hooks);
    - ``_update()``: the scaled gradients unscaled, clipped by their global norm, the optimizer's
      step (skipped where a gradient is not finite), the gradients cleared."""

    _phases: list[tuple[str, Callable[[], None]]] | None = None

    def _next_batch(self) -> tuple[Any, Any]:
        raise NotImplementedError

    def _forward(self, inputs: Any, targets: Any) -> Any:
        raise NotImplementedError

    def _backward(self, loss: Any) -> None:
        raise NotImplementedError

    def _update(self) -> None:
        raise NotImplementedError

    def phases(self) -> list[tuple[str, Callable[[], None]]]:
        """The step as its four phases (data, forward, backward, optimizer), each keeping what
        the next needs: what ``step`` runs."""
        if self._phases is None:
            self._phases = step_phases(self._next_batch, self._forward, self._backward,
                                       self._update)
        return list(self._phases)

    def step(self) -> None:
        """One optimizer step: the four phases, one after the other."""
        for _, run in self._phases or self.phases():
            run()
