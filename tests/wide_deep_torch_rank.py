"""One rank of torch's Wide & Deep ranks job (tests/port_wide_deep.py's ``TORCH_RUNS``, run by
tests/test_ports_ranks.py): the real ``TorchTrainer`` trains a small Wide & Deep under each ``emb`` layout it is given (TorchRec's sharded tables), three AdamW steps, and
writes the whole tables and tower it ends at, gathered from the shards; rank 0 also writes what
one process (the unsharded torch model, no TorchRec) reaches on the same global batch.

Run by torchrun (``python -m torch.distributed.run --nproc-per-node 2
tests/wide_deep_torch_rank.py OUT RUNS_JSON``); each run is a fresh world of its ``world``
processes (the others wait), as in tests/layouts_torch_rank.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from layouts_torch_rank import end, run_each

SIZES = {"vocab": 1000, "deep_width": 8, "hidden_size": 16, "hidden_layers": 2,
         "dense_fields": 13, "deep_slots": 26, "wide_slots": 2, "dropout": 0.0, "zipf": 1.1}
BATCH, SEED, LR = 8, 7, 1e-2
# TorchRec's table names -> the unsharded model's parameters.
TABLES = {"tables.embedding_bags.deep.weight": "deep_embedding.weight",
          "tables.embedding_bags.wide.weight": "wide_embedding.weight"}


def spec_for(layout: Any, sizes: dict[str, Any]) -> Any:
    from pytest_dlperf.core.protocol import Protocol
    from pytest_dlperf.core.spec import OptimizerSpec, PrecisionSpec, RankSpec

    return RankSpec(framework="torch", model="wide_deep", protocol=Protocol(0, 3, 1),
                    batch_size=BATCH, sizes=sizes, seed=SEED, compiler="eager",
                    optimizer=OptimizerSpec(lr=LR, kind="adamw", weight_decay=0.0),
                    precision=PrecisionSpec(),
                    layout=None if layout is None else layout.to_json())


def recipe(ctx: Any) -> Any:
    from pytest_dlperf.models.wide_deep.torch import recipe as wide_deep

    if ctx.sizes.get("wrong_split"):  # every rank trains on rank 0's batch: a wrong split
        ctx = dataclasses.replace(ctx, rank=0)
    return wide_deep(ctx)


def whole(trainer: Any) -> dict[str, torch.Tensor]:
    """Every parameter, whole, under the unsharded model's names: a table from its shards on
    every rank (an all_gather_object), the tower from this rank."""
    model = trainer.model_parts[0]
    mine: list[tuple[str, list[int], torch.Tensor]] = []
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        name = TABLES.get(key, key)
        if hasattr(value, "local_shards"):
            mine += [(name, list(s.metadata.shard_offsets), s.tensor.detach().clone())
                     for s in value.local_shards()]
        else:
            out[name.removeprefix("module.")] = value.detach().clone()
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, mine)
    vocab, width = SIZES["vocab"], SIZES["deep_width"]
    for name, columns in (("deep_embedding.weight", width), ("wide_embedding.weight", 1)):
        if name in out:
            continue
        table = torch.full((vocab, columns), float("nan"))
        for shards in gathered:
            for shard_name, (row, column), tensor in shards:
                if shard_name == name:
                    table[row:row + tensor.shape[0], column:column + tensor.shape[1]] = tensor
        out[name] = table
    return out


def train(layout_text: str | None, world: int, options: dict[str, Any]) -> dict[str, Any]:
    from pytest_dlperf.core.parallel import parse_layout
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.frameworks.torch import build_trainer

    layout = parse_layout(layout_text).resolve(world) if layout_text else None
    trainer = build_trainer(spec_for(layout, {**SIZES, **options}),
                            DistEnv.from_environ(dict(os.environ)), recipe)
    try:
        for _ in range(3):
            trainer.step()
        params = whole(trainer)
        env = trainer.environment()
        held = sum(p.numel() * p.element_size() for p in trainer.model_parts[0].parameters())
        bytes_per_rank: list[Any] = [held]
        if world > 1:
            bytes_per_rank = [None] * world
            torch.distributed.all_gather_object(bytes_per_rank, held)
    finally:
        trainer.close()
    return {"params": params, "environment": env, "bytes_per_rank": bytes_per_rank}


def reference(world: int, lazy: bool = False) -> dict[str, Any]:
    """One process, the unsharded model, on the global batch: rank r's batches are what the
    recipe draws for rank r. ``lazy``: the tables sparse, updated by ``torch.optim.SparseAdam``
    (emb-sparse's algorithm), the rest by AdamW."""
    from pytest_dlperf.core.spec import OptimizerSpec
    from pytest_dlperf.core.workload import BuildContext
    from pytest_dlperf.frameworks.torch import make_optimizer
    from pytest_dlperf.models.wide_deep.torch import recipe as wide_deep

    parts = [wide_deep(BuildContext("torch", "cpu", "cpu", BATCH, SIZES, "fp32", "float32",
                                    False, SEED, rank, world, rank)) for rank in range(world)]
    model = parts[0].model
    tables = [model.deep_embedding, model.wide_embedding] if lazy else []
    for table in tables:
        table.sparse = True
    held = {id(table.weight) for table in tables}
    adamw = make_optimizer(torch, [p for p in model.parameters() if id(p) not in held],
                           OptimizerSpec(lr=LR, kind="adamw", weight_decay=0.0), fused=False)
    sparse = [torch.optim.SparseAdam([table.weight], lr=LR) for table in tables]
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    for _ in range(3):
        batches = [(tuple(t.clone() for t in p.inputs()), p.targets().clone()) for p in parts]
        inputs = tuple(torch.cat([b[0][i] for b in batches]) for i in range(3))
        targets = torch.cat([b[1] for b in batches])
        adamw.zero_grad()
        for optimizer in sparse:
            optimizer.zero_grad()
        loss = parts[0].loss(model(*inputs), targets)
        loss.backward()
        adamw.step()
        for optimizer in sparse:
            optimizer.step()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "start": start}


def main() -> None:
    out, runs = Path(sys.argv[1]), json.loads(sys.argv[2])
    if run_each(out, runs, train) == 0:
        for world, lazy in sorted({(run["world"], "sparse" in str(run["layout"]))
                                   for run in runs}):
            torch.save(reference(world, lazy), out / reference_name(world, lazy))
    end()


def reference_name(world: int, lazy: bool) -> str:
    return f"reference-{world}{'-lazy' if lazy else ''}.pt"


if __name__ == "__main__":
    main()
