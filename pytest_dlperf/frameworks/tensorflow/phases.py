"""The TensorFlow trainer's step in phases, for the diagnostic steps after the timed windows
(``pytest_dlperf.rank.phases``).

The timed step is one ``tf.function`` (XLA-compiled under ``jit_compile``) that reads its batch,
resident on the device or drawn inside the graph, itself: nothing of it runs apart, not even
the data, so it is one phase, ``data+forward+backward+optimizer``, and not a split the windows
never ran. (On CPU workers XLA compiles the step on either side of the all-reduce, but one
outer ``tf.function`` still runs the three.)

The gradients' all-reduce is the adapter's own (Keras' is switched off, ``make_optimizer``), so
it can be left out: switched off, the phase runs a second trace of the same step without it
(``TensorFlowTrainer.traced_step(communicate=False)``, traced at the first diagnostic step,
after every timed window). The separate all-reduce sends the gradients' bytes as one flat
buffer: the strategy packs a list of gradients into one (``bytes_per_pack`` 0).

Runs inside a rank; TensorFlow is reached through the trainer, never imported at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...core.phases import BACKWARD, DATA, FORWARD, OPTIMIZER, merged
from .. import PhasePlan

WHOLE = merged((DATA, FORWARD, BACKWARD, OPTIMIZER))


def plan(trainer: Any) -> PhasePlan:
    """``trainer`` (a ``TensorFlowTrainer``) cut into phases: one, its whole step."""
    switch = _CommSwitch(trainer)
    phases = [(WHOLE, switch.step)]
    note = (f"{WHOLE}: one tf.function"
            + (" (XLA on either side of the all-reduce)" if trainer.xla_around_all_reduce
               else " (XLA)" if trainer.jit else "")
            + " that reads its batch, resident on the device, itself")
    if trainer.strategy.num_replicas_in_sync == 1:
        return PhasePlan(phases, note=note)
    tf, strategy = trainer._tf, trainer.strategy
    variables = trainer.model.trainable_variables
    elements = sum(int(v.shape.num_elements()) for v in variables)
    dtype = tf.as_dtype(variables[0].dtype)  # Keras 3 names it: "float32"
    return PhasePlan(
        phases, communicate=switch, all_reduce=_all_reduce(tf, strategy, elements, dtype),
        ping=_all_reduce(tf, strategy, 1, dtype),
        gradient_bytes=sum(int(v.shape.num_elements()) * tf.as_dtype(v.dtype).size
                           for v in variables),
        buckets=1, note=note,
        how=("the adapter's own gradient all-reduce (MultiWorkerMirroredStrategy's replica "
             "all_reduce, the mean) left out of a second trace of the same tf.function step "
             "(off); communication alone: the gradients' bytes as one flat buffer all-reduced "
             "by the strategy's collectives (one pack, as the step's); every step, with or "
             "without, ends in synchronize's all-reduce of the loss (one element)"))


class _CommSwitch:
    """The step with the gradients' all-reduce (the timed windows' own) or without it."""

    def __init__(self, trainer: Any) -> None:
        self.trainer, self.on = trainer, True
        self._without: Callable[[], Any] | None = None

    def __call__(self, on: bool) -> None:
        self.on = on
        if not on and self._without is None:
            self._without = self.trainer.traced_step(communicate=False)

    def step(self) -> None:
        if self.on or self._without is None:
            self.trainer.step()
        else:  # the loss kept where synchronize waits for it, as after a timed step
            self.trainer._loss = self._without()


def _all_reduce(tf: Any, strategy: Any, elements: int, dtype: Any) -> Callable[[], None]:
    """``elements`` values all-reduced by the strategy's collectives, alone; waits for them."""
    flat = tf.zeros([elements], dtype)

    def replica(value: Any) -> Any:
        summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                                value)
        return summed[0]  # the whole buffer reduced; one element back to the host

    run = tf.function(lambda: strategy.run(replica, args=(flat,)))

    def call() -> None:
        for value in strategy.experimental_local_results(run()):
            value.numpy()

    return call
