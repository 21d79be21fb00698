"""A torch layout's pipeline: the model traced and cut at the recipe's split points
(``torch.distributed.pipelining``), this rank's stages sharded by the other strategies, and
the schedule its step runs. ``parallel.shard`` calls ``build_pipeline``.

Runs inside a rank; torch is passed in or imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.parallel import Layout
from ...core.workload import Parts, WorkloadError


@dataclass
class Pipeline:
    """This rank's pipeline stages and their schedule (``torch.distributed.pipelining``)."""

    stages: list[Any]
    schedule: Any
    first: bool  # holds the first stage: takes the inputs
    last: bool  # holds the last stage: takes the targets, has the loss

    def step(self, torch: Any, inputs: Any, targets: Any) -> Any:
        """Forward and backward of one batch, micro-batch by micro-batch: the mean of the
        micro-batches' losses on the last stage (the batch's mean loss), zero elsewhere."""
        args = (inputs if isinstance(inputs, tuple) else (inputs,)) if self.first else ()
        losses: list[Any] = []
        if self.last:
            self.schedule.step(*args, target=targets, losses=losses)
            return torch.stack([loss.detach() for loss in losses]).mean()
        self.schedule.step(*args)
        return None


def split_points(layout: Layout, parts: Parts) -> list[str]:
    """The module names where stages 1.. begin: ``pp - 1`` of the recipe's for one stage per
    rank (every k-th where it gives more), all of them for an interleaved schedule's virtual
    stages (a multiple of ``pp`` stages, two or more per rank)."""
    names = list(parts.plan("pp") or ())
    if parts.plan("pp") is None or (not names and layout.pp > 1):  # pp1: one stage, []
        raise WorkloadError("a pipeline layout needs the recipe's Parts.plans['pp']: the "
                            "names of the modules where stages after the first begin "
                            "(['layers.2'] for two stages)")
    stages = len(names) + 1
    if stages % layout.pp:
        raise WorkloadError(f"Parts.plans['pp'] gives {stages} stages, not a multiple of "
                            f"the layout's {layout.pp} pipeline ranks")
    if layout.schedule == "interleaved1f1b":
        if stages < 2 * layout.pp:
            raise WorkloadError(f"an interleaved schedule needs two or more stages per rank: "
                                f"Parts.plans['pp'] gives {stages} stages for {layout.pp} "
                                f"ranks; give at least {2 * layout.pp - 1} split points")
        return names
    every = stages // layout.pp
    return names[every - 1::every]


def build_pipeline(torch: Any, model: Any, inputs: Any, layout: Layout, mesh: Any,
                   parts: Parts, device: Any, loss: Callable[[Any, Any], Any],
                   shard_stage: Callable[[Any], None]) -> Pipeline:
    """Traced by ``pipeline()`` at the recipe's split points, this rank's stages (stage ``s``
    on pipeline rank ``s % pp``) sharded by ``shard_stage``, under the layout's schedule.
    Pipelining scales gradients by the micro-batches: with a mean loss, the global batch's."""
    from torch.distributed import pipelining

    names = split_points(layout, parts)
    micro = layout.stage_microbatches
    batch = inputs if isinstance(inputs, tuple) else (inputs,)
    size = batch[0].shape[0]
    if size % micro:
        raise WorkloadError(f"a pipeline of {micro} micro-batches needs a per-replica batch "
                            f"divisible by {micro}; it is {size}: change the batch size or "
                            "the micro-batches (pp2-mb<N>)")
    example = tuple(t.tensor_split(micro)[0] if isinstance(t, torch.Tensor) else t
                    for t in batch)
    pipe = pipelining.pipeline(model, example, split_spec={
        name: pipelining.SplitPoint.BEGINNING for name in names})
    group = mesh["pp"].get_group()
    rank = mesh["pp"].get_local_rank()
    indices = list(range(rank, pipe.num_stages, layout.pp))
    stages: list[Any] = []
    for index in indices:
        shard_stage(pipe.get_stage_module(index))
        keep_traced_dtypes(torch, pipe.get_stage_module(index))
        stages.append(pipe.build_stage(index, device, group=group))
    del pipe  # the other ranks' stage modules can be freed
    schedule: Any
    if layout.schedule == "interleaved1f1b":
        schedule = pipelining.ScheduleInterleaved1F1B(stages, micro, loss_fn=loss)
    else:
        kind = (pipelining.ScheduleGPipe if layout.schedule == "gpipe"
                else pipelining.Schedule1F1B)
        schedule = kind(stages[0], micro, loss_fn=loss)
    last = len(names)
    return Pipeline(stages, schedule, first=0 in indices, last=last in indices)


def keep_traced_dtypes(torch: Any, stage: Any) -> None:
    """A stage's outputs cast back to the dtypes its trace recorded. The trace ran without
    autocast, and the stages size their send and receive buffers and check their outputs by it:
    an output in the autocast dtype crossed a stage boundary as garbage (a loss of NaN here, with
    a bf16 activation at the split), and torch 2.11 refused the last stage's fp16 logits on an
    H200 ("dtype mismatch: expected torch.float32 actual torch.float16")."""
    from torch.utils import _pytree as pytree

    output = next(node for node in stage.graph.nodes if node.op == "output")
    dtypes = [getattr(getattr(leaf, "meta", {}).get("val"), "dtype", None)
              for leaf in pytree.tree_leaves(output.args[0])]

    def cast(_module: Any, _args: Any, outputs: Any) -> Any:
        leaves, spec = pytree.tree_flatten(outputs)
        if len(leaves) != len(dtypes):
            return None
        return pytree.tree_unflatten(
            [leaf.to(dtype) if isinstance(leaf, torch.Tensor) and dtype is not None
             and leaf.is_floating_point() and leaf.dtype != dtype else leaf
             for leaf, dtype in zip(leaves, dtypes)], spec)

    stage.register_forward_hook(cast)
