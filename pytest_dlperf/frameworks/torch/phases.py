"""The torch trainer's step in phases, for the diagnostic steps after the timed windows
(``pytest_dlperf.rank.phases``): the trainer's own step, ``_step.EagerStep``'s four phases, so
that the diagnostic steps run the code the windows ran.

Gradient communication is switched off with a DDP communication hook that hands each bucket
back untouched (``register_comm_hook``, registered at the first diagnostic step, after every
timed window: DDP's built-in all-reduce ran those); switched on, the same hook all-reduces and
averages the bucket as DDP's default does (``default_hooks.allreduce_hook``). The separate
all-reduce sends the gradients' bytes in DDP's bucket sizes (1 MiB first, then 25 MiB).

Runs inside a rank; torch is reached through the trainer, never imported at module level.
"""

from __future__ import annotations

from typing import Any

from ...core.phases import BACKWARD, FORWARD, merged
from .. import PhasePlan, bucket_elements


def plan(trainer: Any) -> PhasePlan:
    """``trainer`` (a ``TorchTrainer``) cut into phases."""
    sharded = trainer.sharded
    pipelined = sharded is not None and sharded.pipeline is not None
    phases = trainer.phases()
    if pipelined:  # the schedule runs forward and backward (_forward's) together
        (_, forward), (_, backward) = phases[1:3]

        def forward_backward() -> None:
            forward()
            backward()

        phases[1:3] = [(merged((FORWARD, BACKWARD)), forward_backward)]
    note = ("forward+backward: one pipeline schedule (its stages' sends and receives "
            "inside)" if pipelined else "")
    torch = trainer._torch
    if trainer.dist.world_size == 1:
        return PhasePlan(phases, note=note)
    ping = _ping(torch, trainer.device)
    if sharded is not None:
        return PhasePlan(phases, ping=ping, note=note, how=(
            f"layout {trainer.layout.id}: its collectives (gathers, reduce-scatters, sends) "
            "run inside forward and backward; exposed communication is not separated"))
    switch = _CommSwitch(torch, trainer.model)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    buffers = _buckets(torch, params, trainer.device)
    return PhasePlan(
        phases, communicate=switch, all_reduce=lambda: _all_reduce(torch, buffers), ping=ping,
        gradient_bytes=sum(p.numel() * p.element_size() for p in params),
        buckets=len(buffers), note=note,
        how=("DDP communication hook: the bucket handed back untouched (off) or all-reduced "
             "and averaged (on); communication alone: the gradients' bytes all-reduced in "
             "DDP's bucket sizes"))


class _CommSwitch:
    """DDP's gradient all-reduce, on or off, through one communication hook."""

    def __init__(self, torch: Any, model: Any) -> None:
        self.torch, self.model, self.on, self.registered = torch, model, True, False

    def __call__(self, on: bool) -> None:
        self.on = on
        if not self.registered:
            self.model.register_comm_hook(None, self._hook())
            self.registered = True

    def _hook(self) -> Any:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        # No annotations: DDP reads the hook's signature, and the string annotations of
        # ``from __future__ import annotations`` are not dist.GradBucket to it.
        def hook(state, bucket):  # type: ignore[no-untyped-def]
            if self.on:
                # None: the default process group, as DDP's own default hook.
                return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]
            future = self.torch.futures.Future()
            future.set_result(bucket.buffer())
            return future

        return hook


def _buckets(torch: Any, params: list[Any], device: Any) -> list[Any]:
    """Flat buffers of the gradients' bytes, cut as DDP buckets them."""
    sizes = bucket_elements([(p.numel(), p.element_size()) for p in params])
    return [torch.zeros(n, dtype=params[0].dtype, device=device) for n in sizes]


def _all_reduce(torch: Any, buffers: list[Any]) -> None:
    works = [torch.distributed.all_reduce(b, async_op=True) for b in buffers]
    for work in works:
        work.wait()


def _ping(torch: Any, device: Any) -> Any:
    one = torch.zeros(1, device=device)
    return lambda: torch.distributed.all_reduce(one)
