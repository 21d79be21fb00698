"""The OneFlow trainer's step in phases, for the diagnostic steps after the timed windows
(``pytest_dlperf.rank.phases``): eagerly, the trainer's own data, forward, backward and update
methods, one phase each; in nn.Graph (the ``compiled`` mode) the data, then the graph, which
runs forward, backward and the optimizer as one plan: one phase, not a split it never ran.

OneFlow 0.9's eager DistributedDataParallel has neither ``no_sync`` nor communication hooks: it
all-reduces a bucket from a gradient hook once every parameter of the bucket is ready and the
bucket is not marked done (``_ddp_state_for_reversed_params``, reset by its own hook after each
forward). Switched off, a forward hook registered after DDP's (at the first diagnostic step,
after every timed window) marks every bucket done, so backward all-reduces none. nn.Graph
inserts the gradients' all-reduce into its plan, where it cannot be left out. The separate
all-reduce sends the gradients' bytes in DDP's own buckets (10 parameters each), through the
collective DDP calls (``flow._C.local_all_reduce``); one flat buffer beside a graph.

Runs inside a rank; OneFlow is reached through the trainer, never imported at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...core.phases import BACKWARD, DATA, FORWARD, OPTIMIZER, merged
from .. import PhasePlan

DDP_STATE = "_ddp_state_for_reversed_params"  # OneFlow 0.9's DDP: param -> [ready, reduced]


def plan(trainer: Any) -> PhasePlan:
    """``trainer`` (a ``OneFlowTrainer``) cut into phases."""
    phases, note = _phases(trainer)
    flow = trainer._flow
    if flow.env.get_world_size() == 1:
        return PhasePlan(phases, note=note)
    one = flow.zeros(1, device=trainer.device)
    ping = _all_reduce(flow, [one])
    gradient_bytes = sum(p.numel() * p.element_size() for p in trainer.params)
    if trainer.sharding is not None:
        return PhasePlan(phases, ping=ping, note=note, how=(
            f"layout {trainer.sharding.layout.id}: the collectives OneFlow inserts for its "
            "global tensors run inside the step; exposed communication is not separated"))
    if trainer.graph or not hasattr(trainer.model, DDP_STATE):
        flat = [flow.zeros(sum(p.numel() for p in trainer.params), device=trainer.device)]
        return PhasePlan(
            phases, all_reduce=_all_reduce(flow, flat), ping=ping,
            gradient_bytes=gradient_bytes, buckets=1, note=note,
            how=("nn.Graph inserts the gradients' all-reduce into its plan, where it cannot be "
                 "left out: exposed communication is not separated; communication alone: the "
                 "gradients' bytes as one flat buffer (flow._C.local_all_reduce)"
                 if trainer.graph else "this OneFlow's DDP has no bucket state to switch"))
    buffers = [flow.zeros_like(t) for t in trainer.model._bucket_tensors]
    return PhasePlan(
        phases, communicate=_CommSwitch(trainer.model), all_reduce=_all_reduce(flow, buffers),
        ping=ping, gradient_bytes=gradient_bytes, buckets=len(buffers), note=note,
        how=("DDP's buckets marked all-reduced after forward, so that its gradient hooks "
             "all-reduce none (off), or left as DDP leaves them (on); communication alone: the "
             "gradients' bytes in DDP's own buckets, flow._C.local_all_reduce as DDP's"))


def _phases(trainer: Any) -> tuple[list[tuple[str, Callable[[], None]]], str]:
    state: dict[str, Any] = {}

    def data() -> None:
        state["batch"] = trainer._next_batch()

    if trainer.graph:
        def whole() -> None:
            trainer._loss = trainer.train_step(*state.pop("batch"))

        name = merged((FORWARD, BACKWARD, OPTIMIZER))
        return [(DATA, data), (name, whole)], f"{name}: one nn.Graph (the optimizer inside it)"

    def forward() -> None:
        trainer._loss = state["loss"] = trainer._forward(*state.pop("batch"))

    def backward() -> None:
        state["finite"] = trainer._backward(state.pop("loss"))

    def update() -> None:
        trainer._update(state.pop("finite"))

    return [(DATA, data), (FORWARD, forward), (BACKWARD, backward), (OPTIMIZER, update)], ""


class _CommSwitch:
    """DDP's gradient all-reduce, on or off, through one forward hook after DDP's own."""

    def __init__(self, model: Any) -> None:
        self.model, self.on, self.registered = model, True, False

    def __call__(self, on: bool) -> None:
        self.on = on
        if not self.registered:
            self.model.register_forward_hook(self._after_forward)
            self.registered = True

    def _after_forward(self, module: Any, inputs: Any, output: Any) -> None:
        if not self.on:  # every bucket taken for all-reduced: backward's hooks skip them all
            for ready_reduced in getattr(module, DDP_STATE).values():
                ready_reduced[1] = True


def _all_reduce(flow: Any, buffers: list[Any]) -> Callable[[], None]:
    """The buffers all-reduced in place, queued on OneFlow's virtual machine (the driver's
    synchronize waits for them)."""
    def run() -> None:
        for buffer in buffers:
            flow._C.local_all_reduce(buffer, inplace=True)

    return run
