"""The MindSpore trainer's step in phases, for the diagnostic steps after the timed windows
(``pytest_dlperf.rank.phases``). MindSpore computes the loss and its gradients in one call
(``value_and_grad``), so forward and backward are one phase, ``forward+backward``; the
gradients' averaging, clipping and the update are the optimizer phase. A compiled step
(``mindspore.jit``) is one graph: ``forward+backward+optimizer``.

Gradient communication is switched by building the step without ``DistributedGradReducer``
(compiled: a second graph without it, compiled by the first untimed step that uses it). The
reducer all-reduces after backward, so nothing of it can hide behind backward here: exposed is
all of it. Communication alone: one all-reduce per gradient, as the reducer issues them in
PyNative mode, through ``ops.AllReduce``.

Runs inside a rank; MindSpore is reached through the trainer, never imported at module level.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ...core.phases import BACKWARD, DATA, FORWARD, OPTIMIZER, merged
from .. import PhasePlan

FORWARD_BACKWARD = merged((FORWARD, BACKWARD))


def plan(trainer: Any) -> PhasePlan:
    """``trainer`` (a ``MindSporeTrainer``) cut into phases."""
    state: dict[str, Any] = {}
    steps = {True: trainer.train_step, False: None}
    updates = {True: trainer._update_fn(True), False: trainer._update_fn(False)}
    communicating = [True]

    def data() -> None:
        state["batch"] = trainer._next_batch()

    def forward_backward() -> None:
        state["loss"], state["grads"] = trainer._grad(*state.pop("batch"))
        trainer._loss = state["loss"]

    def update() -> None:
        trainer._loss = updates[communicating[0]](state.pop("loss"), state.pop("grads"))

    def whole() -> None:
        on = communicating[0]
        if steps[on] is None:
            steps[on] = trainer._ms.jit(trainer._make_step(communicate=on))
        trainer._loss = steps[on](*trainer.step_args(state.pop("batch")))

    if trainer.compiled:
        phases = [(DATA, data), (merged((FORWARD, BACKWARD, OPTIMIZER)), whole)]
        note = "forward+backward+optimizer: one graph (mindspore.jit)"
    else:
        phases = [(DATA, data), (FORWARD_BACKWARD, forward_backward), (OPTIMIZER, update)]
        note = "forward+backward: one call (mindspore.value_and_grad)"
    if trainer.reducer is None:
        return PhasePlan(phases, note=note)

    def communicate(on: bool) -> None:
        communicating[0] = on

    ms = trainer._ms
    all_reduce = ms.ops.AllReduce()
    buffers = [ms.ops.zeros(tuple(p.shape), p.dtype) for p in trainer.params]
    one = ms.ops.zeros((1,), ms.float32)
    return PhasePlan(
        phases, communicate=communicate, all_reduce=_each(all_reduce, buffers),
        ping=_each(all_reduce, [one]), buckets=len(buffers),
        gradient_bytes=sum(math.prod(p.shape) * p.itemsize for p in trainer.params),
        note=note,
        how=("the step built without DistributedGradReducer (off) and with it (on); "
             "communication alone: one ops.AllReduce per gradient, as the reducer issues them"))


def _each(all_reduce: Any, buffers: list[Any]) -> Callable[[], None]:
    def run() -> None:
        for buffer in buffers:
            all_reduce(buffer).asnumpy()

    return run
