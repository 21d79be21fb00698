"""torch's strategy for the ``emb`` layout kind: the model's TorchRec embedding tables
(``torchrec.EmbeddingBagCollection``) sharded over the kind's ranks by the term's plan, with
TorchRec's own sharders (``torchrec.distributed.shard_modules``); the rest of the model replicated,
its gradients averaged over the same ranks after backward. Each rank trains on a batch of its
own; TorchRec's input and output all-to-alls carry the ids to the ranks that hold their rows and
the pooled vectors back (its backward divides the tables' gradients by the ranks, as DDP does the
tower's).

The plans (``core.kinds.emb.EMBEDDING_PLANS``), table by table, biggest first:

- ``dp``: every table whole on every rank (TorchRec's data-parallel sharding), averaged;
- ``tw``: each table whole on the rank that holds the fewest bytes so far;
- ``cw``: each table's columns split evenly over the ranks (a table too narrow to split goes
  whole to the least loaded rank);
- ``twcw``: each table on the least loaded node, its columns split over that node's ranks;
- ``rw``: each table's rows split evenly over the ranks.

Compute kernel ``dense``: the tables are plain parameters that the workload's optimizer updates
(TorchRec's fused kernels run only SGD and Adagrad on a CPU). The tables' weights are the
unsharded model's: each shard copies its rows and columns from them, so that a plan trains the
same model as one process.

Runs inside a rank; torch and TorchRec are imported inside the functions (the leading underscore
keeps ``frameworks.known_frameworks`` from taking it for an adapter).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.kinds import LayoutError
from ...core.kinds.emb import embedding_plan
from ...core.strategies import TorchPart, only_kind, register_strategy
from ...core.workload import WorkloadError
from .sparse import lazy_tables

TORCHREC = ("torchrec==1.9.2 and fbgemm-gpu-cpu==1.9.0 (fbgemm-gpu on CUDA) installed with "
            "--no-deps beside torch 2.14 (scripts/setup does)")


@dataclass(frozen=True)
class ShardTables:
    """TorchRec's sharding of every ``EmbeddingBagCollection`` in the model, by the plan."""

    kind: str = "emb"

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        alone = only_kind("emb", kinds,
                          "the torch adapter shards tables beside a data-parallel tower only")
        if alone:
            return alone
        if compiled:
            return ("torch.compile of a model with TorchRec's sharded tables: not tried here "
                    "(its all-to-alls are not traced); run the eager case")
        if importlib.util.find_spec("torchrec") is None:
            return f"TorchRec is not installed: the emb kind shards its tables; {TORCHREC}"
        return None

    def apply(self, part: TorchPart) -> None:
        shard_tables(part)


register_strategy("torch", ShardTables())


def shard_tables(part: TorchPart) -> None:
    """Every collection of ``part``'s model sharded by the term's plan over the ``emb`` ranks;
    what stays whole on every rank left to be averaged (``part.averaged``), the shards said in
    ``part.notes["emb"]``."""
    torch = part.torch
    try:
        plan_name = embedding_plan(part.layout.options_of("emb"))
    except LayoutError as exc:
        raise WorkloadError(f"layout {part.layout.id}: {exc}") from None
    if part.spec.optimizer.clip_norm is not None:
        raise WorkloadError("gradient clipping under an emb layout: the norm over the tables' "
                            "shards is not written; clear the optimizer's clip_norm")
    if plan_name == "sparse":  # no TorchRec: torch's own sparse gradients
        return lazy_tables(part, part.mesh["emb"].get_group())
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.shard import shard_modules
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    model = part.module
    collections = {name: module for name, module in model.named_modules()
                   if isinstance(module, EmbeddingBagCollection)}
    if not collections or "" in collections:
        raise WorkloadError(
            f"layout {part.layout.id} shards TorchRec tables, and the model "
            f"({type(model).__name__}) holds no torchrec.EmbeddingBagCollection below its "
            "root: build its tables as one when ctx.layout uses 'emb' (models/wide_deep/torch.py "
            "does)")
    group = part.mesh["emb"].get_group()
    dist = torch.distributed
    world = dist.get_world_size(group)
    per_node = min(world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    device = next(model.parameters()).device
    # The unsharded weights, by the shard_modules state_dict key each shard is filled from.
    full = {f"{name}.{key}": value.detach() for name, ebc in collections.items()
            for key, value in ebc.state_dict().items()}
    # TorchRec's sharded module keeps the parameters it was built from (its sharding infos):
    # on the meta device, as its users build them, they hold no memory beside the shards.
    for ebc in collections.values():
        for bag in ebc.embedding_bags.values():
            bag.weight = torch.nn.Parameter(bag.weight.to("meta"),
                                            requires_grad=bag.weight.requires_grad)
    loads = [0] * world
    plan = ShardingPlan({
        name: _module_plan(ebc, plan_name, world, per_node, device.type, loads)
        for name, ebc in collections.items()})
    shard_modules(model, env=ShardingEnv.from_process_group(group), plan=plan, device=device,
                  sharders=[EmbeddingBagCollectionSharder()])
    replicated_tables = _fill_shards(torch, model, collections, full)
    sharded = {f"{name}.{key}" for name in collections
               for key in model.get_submodule(name).state_dict()} - replicated_tables
    part.averaged.append(([p for key, p in model.named_parameters()
                           if key not in sharded and p.requires_grad], group))
    part.notes["emb"] = {"plan": plan_name, "tables": {
        f"{name}.{table}": _placements(sharding)
        for name, module_plan in plan.plan.items() for table, sharding in module_plan.items()}}


def _fill_shards(torch: Any, model: Any, collections: dict[str, Any],
                 full: dict[str, Any]) -> set[str]:
    """Each shard this rank holds filled from the unsharded weights; the keys of the tables
    every rank holds whole (data parallel), whose gradients are averaged like the tower's."""
    replicated: set[str] = set()
    with torch.no_grad():
        for name in collections:
            for key, value in model.get_submodule(name).state_dict().items():
                source = full[f"{name}.{key}"]
                if hasattr(value, "local_shards"):
                    for shard in value.local_shards():
                        (r, c), (rows, cols) = (shard.metadata.shard_offsets,
                                                shard.metadata.shard_sizes)
                        shard.tensor.copy_(source[r:r + rows, c:c + cols])
                else:  # data parallel: the whole table
                    value.copy_(source)
                    replicated.add(f"{name}.{key}")
    return replicated


def _module_plan(ebc: Any, plan_name: str, world: int, per_node: int, device_type: str,
                 loads: list[int]) -> Any:
    """One collection's plan, its tables biggest first, ``loads`` (bytes per rank) carried
    from collection to collection."""
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )

    tables = sorted(ebc.embedding_bag_configs(),
                    key=lambda t: (-t.num_embeddings * t.embedding_dim, t.name))
    chosen: dict[str, Callable[..., Any]] = {}
    for table in tables:
        size = table.num_embeddings * table.embedding_dim
        dim = table.embedding_dim
        if plan_name == "dp":
            chosen[table.name] = data_parallel()
        elif plan_name == "rw":
            chosen[table.name] = row_wise(compute_kernel="dense")
        elif plan_name == "cw" and dim % world == 0 and dim >= world:
            chosen[table.name] = column_wise(ranks=list(range(world)), compute_kernel="dense")
            loads[:] = [load + size // world for load in loads]
        elif plan_name == "twcw" and dim % per_node == 0 and dim >= per_node:
            node = min(range(world // per_node),
                       key=lambda n: (sum(loads[n * per_node:(n + 1) * per_node]), n))
            ranks = list(range(node * per_node, (node + 1) * per_node))
            chosen[table.name] = _table_column_wise(ranks)
            for rank in ranks:
                loads[rank] += size // per_node
        else:  # tw, or a table too narrow for cw and twcw: whole on the least loaded rank
            rank = min(range(world), key=lambda r: (loads[r], r))
            chosen[table.name] = table_wise(rank=rank, compute_kernel="dense")
            loads[rank] += size
    return construct_module_sharding_plan(ebc, per_param_sharding=chosen, local_size=per_node,
                                          world_size=world, device_type=device_type)


def _table_column_wise(ranks: list[int]) -> Callable[..., Any]:
    """TorchRec's table-column-wise sharding on ``ranks`` (one node's): its planner makes it,
    and ``sharding_plan`` has no helper for it; this is ``column_wise`` under TWCW's name."""
    from torchrec.distributed import sharding_plan as sp
    from torchrec.distributed.types import ShardingType

    def generate(param: Any, local_size: int, world_size: int, device_type: str,
                 sharder: Any) -> Any:
        sizes = sp._get_parameter_size_offsets(param, ShardingType.COLUMN_WISE, local_size,
                                               world_size,
                                               col_wise_shard_dim=param.shape[1] // len(ranks))
        return sp._get_parameter_sharding(
            param, ShardingType.TABLE_COLUMN_WISE.value,
            [(size, offset, rank) for (size, offset), rank in zip(sizes, ranks)], local_size,
            device_type, sharder, compute_kernel="dense")

    return generate


def _placements(sharding: Any) -> list[list[int]]:
    """A table's shards as ``[rank, first row, first column, rows, columns]``; a replicated
    table's as one whole shard with rank -1."""
    spec = sharding.sharding_spec
    if spec is None:
        return [[-1, 0, 0, -1, -1]]
    shards = []
    for shard in spec.shards:
        rank = int(str(shard.placement).split("rank:")[1].split("/")[0])
        shards.append([rank, *shard.shard_offsets, *shard.shard_sizes])
    return sorted(shards)
