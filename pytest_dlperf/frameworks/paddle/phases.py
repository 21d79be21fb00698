"""The Paddle trainer's step in phases, for the diagnostic steps after the timed windows
(``pytest_dlperf.rank.phases``): the trainer's own data, forward, backward and update methods,
one phase each, so that the diagnostic steps run the code the windows ran. The ``compiled``
mode keeps them apart too: ``to_static`` makes the model's forward one static program, whose
gradient program backward runs, and the optimizer stays eager, so nothing merges them.

Gradient communication is switched off with ``DataParallel.no_sync()``, entered for the steps
without it and left for the steps with it (read at forward: the reducer then prepares no
all-reduce for backward). The separate all-reduce sends the gradients' bytes in DataParallel's
buffer sizes (``last_comm_buffer_size`` 1 MiB first, then ``comm_buffer_size`` 25 MiB) through
``paddle.distributed.all_reduce`` (gloo on CPU, NCCL on CUDA).

Runs inside a rank; Paddle is reached through the trainer, never imported at module level.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

from .. import PhasePlan, bucket_elements


def plan(trainer: Any) -> PhasePlan:
    """``trainer`` (a ``PaddleTrainer``) cut into phases."""
    phases = trainer.phases()
    note = ("forward: one static program (paddle.jit.to_static), backward its gradient "
            "program, the optimizer eager" if trainer.compiled else "")
    paddle = trainer._paddle
    if not paddle.distributed.is_initialized() or paddle.distributed.get_world_size() == 1:
        return PhasePlan(phases, note=note)
    ping = _all_reduce(paddle, [paddle.zeros([1], dtype="float32")])
    if trainer.tensor_parallel:
        return PhasePlan(phases, ping=ping, note=note, how=(
            "tensor parallel: the collectives Paddle inserts for its dist tensors run inside "
            "forward and backward; exposed communication is not separated"))
    params = trainer.params
    buffers = [paddle.zeros([n], dtype=params[0].dtype) for n in bucket_elements(
        [(math.prod(p.shape), p.element_size()) for p in params])]
    return PhasePlan(
        phases, communicate=_CommSwitch(trainer.model), all_reduce=_all_reduce(paddle, buffers),
        ping=ping, gradient_bytes=sum(math.prod(p.shape) * p.element_size() for p in params),
        buckets=len(buffers), note=note,
        how=("DataParallel's no_sync(): entered (off), left (on); communication alone: the "
             "gradients' bytes in DataParallel's buffer sizes, paddle.distributed.all_reduce"))


class _CommSwitch:
    """DataParallel's gradient all-reduce, on or off, through its own ``no_sync``."""

    def __init__(self, model: Any) -> None:
        self.model, self.off = model, contextlib.ExitStack()

    def __call__(self, on: bool) -> None:
        self.off.close()
        if not on:
            self.off.enter_context(self.model.no_sync())


def _all_reduce(paddle: Any, buffers: list[Any]) -> Callable[[], None]:
    def run() -> None:
        for buffer in buffers:
            paddle.distributed.all_reduce(buffer)

    return run
