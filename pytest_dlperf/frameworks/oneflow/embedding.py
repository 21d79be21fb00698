"""OneFlow's strategy for the ``emb`` layout kind, the way OneFlow-Benchmark's Wide & Deep
shards its tables: each table a global tensor split over the kind's ranks by rows
(``flow.sbp.split(0)``), the rest of the model broadcast (data parallel), the batch split over
the ranks (each rank's own per-device batch), and OneFlow's SBP inference inserting the
collectives.

A table's lookup takes the ids broadcast (an all-gather of every rank's ids) against the
row-split table, which gives each rank a partial sum of every sample's vectors (zeros for the
rows it does not hold); turning that into the batch split again is a reduce-scatter, and the
backward the reverse. The tables are named by the recipe: ``Parts.plans["emb"]``, the names of
its ``nn.Embedding`` modules (``models/wide_deep/oneflow.py``). OneFlow-Benchmark writes the two
conversions into its model's ``forward``; here a forward pre-hook and a forward hook on each
table do them, so that the recipe's model stays the unsharded one.

The plans (``core.kinds.emb.EMBEDDING_PLANS``) it runs: ``rw`` (every table's rows split evenly
over the ranks) and ``dp`` (every table whole on every rank, broadcast like the tower). The
others refuse where the layout is applied (``why_not`` sees the kinds, not the plan), saying
why (``REFUSED``).

Runs inside a rank; OneFlow is passed in, never imported at module level (the leading
underscore keeps ``frameworks.known_frameworks`` from taking it for an adapter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.kinds import LayoutError
from ...core.kinds.emb import embedding_plan
from ...core.strategies import only_kind, register_strategy
from ...core.workload import WorkloadError
from .parallel import OneFlowPart

RUNS = ("rw", "dp")
# What a plan OneFlow does not run would need, read from OneFlow 0.9's SBP (a global tensor is
# one placement with one SBP per placement dimension).
REFUSED = {
    "tw": ("table-wise puts each table whole on one rank: a global tensor on a placement of that "
           "rank alone, its lookups moved between placements every step; not ported to OneFlow "
           "(run emb-rw, OneFlow-Benchmark's row split)"),
    "cw": ("column-wise (flow.sbp.split(1)) splits a table whose width the ranks divide and puts "
           "a narrower one (Wide & Deep's wide table, 1 column) whole on one rank, as TorchRec "
           "does: the second is table-wise, not ported to OneFlow (run emb-rw)"),
    "twcw": ("table-column-wise puts each table on one node's ranks, a placement of its own per "
             "table: not ported to OneFlow (run emb-rw)"),
    "sparse": ("lazy Adam on the tables' sparse gradients is torch's SparseAdam here; OneFlow "
               "0.9's eager lazy Adam is not ported (run emb-rw)"),
}


# Measured 2026-11-29, OneFlow 0.9.0 on 2 CPU processes: the training graph of Wide & Deep with
# its tables split by rows aborts both ranks as it starts (ZeRO's graph does the same on CPU).
GRAPH_ABORTS = ("OneFlow 0.9's nn.Graph aborts on CPU with the tables split by rows: "
                "'register.cpp:75 Check failed: separated_header_mem_ptr() == nullptr'; run the "
                "eager case")


@dataclass(frozen=True)
class SplitTables:
    """The recipe's tables as global tensors split by rows over the ranks, the rest broadcast."""

    kind: str = "emb"

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        alone = only_kind("emb", kinds,
                          "the oneflow adapter splits tables beside a data-parallel tower only")
        if alone:
            return alone
        if compiled:
            return (GRAPH_ABORTS if device_type == "cpu" else
                    "nn.Graph with tables split by rows: untried on CUDA here (it aborts on "
                    "CPU); run the eager case")
        return None

    def apply(self, part: OneFlowPart) -> None:
        split_tables(part)


register_strategy("oneflow", SplitTables())


def plan_of(layout: Any) -> str:
    """The layout's emb plan, refused where OneFlow does not run it (``WorkloadError``)."""
    try:
        plan = embedding_plan(layout.options_of("emb"))
    except LayoutError as exc:
        raise WorkloadError(f"layout {layout.id}: {exc}") from None
    if plan not in RUNS:
        raise WorkloadError(f"layout {layout.id}: OneFlow runs the emb plans "
                            f"{', '.join(RUNS)}; {plan}: {REFUSED[plan]}")
    return plan


def tables_of(flow: Any, model: Any, named: Any) -> dict[str, Any]:
    """The ``nn.Embedding`` modules ``Parts.plans["emb"]`` names, by name."""
    embeddings = [name for name, module in model.named_modules()
                  if isinstance(module, flow.nn.Embedding)]
    if not named or isinstance(named, str):
        raise WorkloadError(
            "an emb layout splits the tables the recipe names: give Parts(plans={'emb': "
            f"[names of its nn.Embedding modules]}}) (this model's: {embeddings or 'none'}); "
            f"got {named!r}")
    modules = dict(model.named_modules())
    wrong = [name for name in named if name not in embeddings]
    if wrong:
        raise WorkloadError(
            f"Parts.plans['emb'] names {wrong}, which are not nn.Embedding modules of the model "
            f"({type(model).__name__}: its nn.Embedding modules are {embeddings or 'none'})")
    return {name: modules[name] for name in named}


def row_shards(rows: int, columns: int, world: int) -> list[list[int]]:
    """Where ``flow.sbp.split(0)`` puts a table's rows, ``[rank, first row, first column, rows,
    columns]`` each: OneFlow's even split, the first ``rows % world`` ranks one row more."""
    shards, first = [], 0
    for rank in range(world):
        held = rows // world + (1 if rank < rows % world else 0)
        shards.append([rank, first, 0, held, columns])
        first += held
    return shards


def split_tables(part: OneFlowPart) -> None:
    flow, layout = part.flow, part.layout
    plan = plan_of(layout)
    if part.spec.optimizer.clip_norm is not None:
        raise WorkloadError("gradient clipping under an emb layout on OneFlow: not checked "
                            "against one process here; clear the optimizer's clip_norm")
    tables = tables_of(flow, part.module, part.parts.plan("emb"))
    world = layout.world_size
    notes: dict[str, Any] = {}
    for name, table in tables.items():
        rows, columns = table.weight.shape
        if plan == "dp":  # broadcast like the tower, as the placement left it
            notes[name] = [[-1, 0, 0, -1, -1]]
            continue
        weight = table.weight
        table.weight = flow.nn.Parameter(
            weight.to_global(part.placement, flow.sbp.split(0)),
            requires_grad=weight.requires_grad)
        table.register_forward_pre_hook(_ids_to_everyone)
        table.register_forward_hook(_vectors_to_their_samples)
        notes[name] = row_shards(rows, columns, world)
    part.notes["emb"] = {"plan": plan, "tables": notes}


def _ids_to_everyone(module: Any, inputs: Any) -> Any:
    # Every rank looks every id up in its rows: the ids all-gathered (split -> broadcast).
    import oneflow as flow

    ids = inputs[0]
    return (ids.to_global(placement=ids.placement, sbp=flow.sbp.broadcast), *inputs[1:])


def _vectors_to_their_samples(module: Any, inputs: Any, output: Any) -> Any:
    # Each rank's partial sums reduce-scattered back to its samples (partial -> split).
    import oneflow as flow

    return output.to_global(placement=output.placement, sbp=flow.sbp.split(0))
