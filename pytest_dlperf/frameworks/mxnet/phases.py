"""The MXNet trainer's step in phases, for the diagnostic steps after the timed windows
(``pytest_dlperf.rank.phases``): the trainer's own data, forward, backward and update methods,
one phase each, so that the diagnostic steps run the code the windows ran. The ``compiled``
mode keeps them apart too: a hybridized block's forward is one static graph, backward its
gradient graph, and the update stays op by op.

Gradient communication is the update's first part (a push and a pull of every gradient through
the distributed store), after backward, so nothing of it hides
behind backward: exposed is all of it. It is switched off by leaving that call out. The
separate all-reduce pushes and pulls buffers of the gradients' shapes under keys of their own,
one per gradient as the trainer sends them; the ping, one element.

Runs inside a rank; MXNet is reached through the trainer, never imported at module level.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import PhasePlan

# Keys of the diagnostic buffers in the store, past any model's parameters (the trainer's keys
# are the parameters' indices).
FIRST_KEY = 1_000_000


def plan(trainer: Any) -> PhasePlan:
    """``trainer`` (an ``MXNetTrainer``) cut into phases."""
    phases = trainer.phases()
    note = ("forward: one static graph (hybridize), backward its gradient graph, the update "
            "op by op" if trainer.compiled else "")
    kvstore = trainer.kvstore
    if kvstore is None:
        return PhasePlan(phases, note=note)
    nd, context = trainer._mx.nd, trainer.context
    buffers = [nd.zeros(p.shape, ctx=context, dtype="float32") for p in trainer.params]
    one = [nd.zeros((1,), ctx=context, dtype="float32")]
    keys = list(range(FIRST_KEY, FIRST_KEY + len(buffers) + 1))
    for key, buffer in zip(keys, buffers + one):  # every worker, in the same order
        kvstore.init(key, buffer)

    def communicate(on: bool) -> None:
        trainer.communicating = on

    return PhasePlan(
        phases, communicate=communicate, all_reduce=_push_pull(kvstore, keys[:-1], buffers),
        ping=_push_pull(kvstore, keys[-1:], one), buckets=len(buffers),
        gradient_bytes=sum(math.prod(p.shape) * 4 for p in trainer.params), note=note,
        how=("the gradients' push and pull left out of the update (off) and made (on); "
             "communication alone: a push and a pull of each gradient's shape through the "
             f"store ({kvstore.type}), as the trainer sends them"))


def _push_pull(kvstore: Any, keys: list[int], buffers: list[Any]) -> Callable[[], None]:
    def run() -> None:
        for key, buffer in zip(keys, buffers):
            kvstore.push(key, buffer)
            kvstore.pull(key, out=buffer)

    return run
