"""One rank of OneFlow's Wide & Deep ranks job (tests/port_wide_deep.py's ``ONEFLOW_RUNS``, run by
tests/test_ports_ranks.py): the real ``OneFlowTrainer`` trains a small
Wide & Deep under each run it is given (DDP, or an ``emb`` layout: the tables global tensors
split by rows), three Adam steps, and each rank writes the whole parameters the run ends at
(gathered from the global tensors), the shapes of the tables it holds and its parameters'
bytes; rank 0 also writes what one process (the unsharded model) reaches on the same global
batch.

Run by OneFlow's own launcher (``python -m oneflow.distributed.launch --nproc_per_node 2
tests/wide_deep_oneflow_rank.py OUT RUNS_JSON``); each run is ``{"name", "layout" (or null:
DDP), "compiler", "options"}`` (``options``: ``{"wrong_split": 1}`` makes every rank draw rank
0's batch).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import oneflow as flow

from pytest_dlperf.core.parallel import parse_layout
from pytest_dlperf.core.protocol import Protocol
from pytest_dlperf.core.spec import OptimizerSpec, PrecisionSpec, RankSpec
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.frameworks import DistEnv, load

SIZES = {"vocab": 1000, "deep_width": 8, "hidden_size": 16, "hidden_layers": 2,
         "dense_fields": 13, "deep_slots": 26, "wide_slots": 2, "dropout": 0.0, "zipf": 1.1}
BATCH, SEED, LR, STEPS = 8, 7, 1e-2, 3
TABLES = ("wide_embedding.weight", "deep_embedding.weight")


def spec_for(layout: Any, compiler: str, options: dict[str, Any]) -> RankSpec:
    return RankSpec(framework="oneflow", model="wide_deep", protocol=Protocol(0, STEPS, 1),
                    batch_size=BATCH, sizes={**SIZES, **options}, seed=SEED, compiler=compiler,
                    optimizer=OptimizerSpec(lr=LR, kind="adamw", weight_decay=0.0),
                    precision=PrecisionSpec(),
                    layout=None if layout is None else layout.to_json())


def recipe(ctx: Any) -> Any:
    from pytest_dlperf.models.wide_deep.oneflow import recipe as wide_deep

    if ctx.sizes.get("wrong_split"):  # every rank trains on rank 0's batch: a wrong split
        ctx = dataclasses.replace(ctx, rank=0)
    return wide_deep(ctx)


def names() -> list[str]:
    from pytest_dlperf.models.wide_deep import WideDeepShape
    from pytest_dlperf.models.wide_deep.oneflow import build

    return [name for name, _ in build(WideDeepShape.of(SIZES)).named_parameters()]


def train(run: dict[str, Any], dist: DistEnv) -> dict[str, Any]:
    world = dist.world_size
    layout = parse_layout(run["layout"]).resolve(world) if run["layout"] else None
    spec = spec_for(layout, run.get("compiler", "eager"), run.get("options", {}))
    trainer = load("oneflow").build_trainer(spec, dist, recipe)
    for _ in range(STEPS):
        trainer.step()
    trainer.synchronize()
    everyone = flow.placement("cpu", ranks=list(range(world)))
    params, held, local_shapes = {}, 0, {}
    for name, param in zip(names(), trainer.params):
        local = param.to_local() if param.is_global else param
        held += local.numel() * local.element_size()
        if name in TABLES:
            local_shapes[name] = list(local.shape)
        if param.is_global:
            param = param.to_global(placement=everyone, sbp=flow.sbp.broadcast).to_local()
        params[name] = param.numpy().copy()  # numpy() may share the memory the steps update
    return {"params": params, "held": held, "local_shapes": local_shapes,
            "loss": trainer.loss(), "environment": trainer.environment()}


def reference(world: int) -> dict[str, Any]:
    """One process, the unsharded model, on the global batch: rank r's batches are what the
    recipe draws for rank r."""
    from pytest_dlperf.frameworks.oneflow.update import make_optimizer
    from pytest_dlperf.models.wide_deep.oneflow import recipe as wide_deep

    parts = [wide_deep(BuildContext("oneflow", "cpu", "cpu", BATCH, SIZES, "fp32", "float32",
                                    False, SEED, rank, world, rank)) for rank in range(world)]
    model = parts[0].model
    adam = make_optimizer(flow, list(model.parameters()),
                          OptimizerSpec(lr=LR, kind="adamw", weight_decay=0.0), graph=False)
    start = {n: p.numpy().copy() for n, p in model.named_parameters()}
    for _ in range(STEPS):
        batches = [(p.inputs(), p.targets()) for p in parts]
        inputs = tuple(flow.cat([b[0][i] for b in batches]) for i in range(3))
        targets = flow.cat([b[1] for b in batches])
        adam.zero_grad()
        parts[0].loss(model(*inputs), targets).backward()
        adam.step()
    return {"params": {n: p.numpy().copy() for n, p in model.named_parameters()},
            "start": start}


def main(out_dir: str, runs_json: str) -> None:
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    dist = DistEnv(rank, world, rank, world, 0)
    out = Path(out_dir)
    for run in json.loads(runs_json):
        try:
            result = train(run, dist)
        except Exception as exc:  # noqa: BLE001 - the test reads what failed
            result = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            gc.collect()  # the run's global tensors freed on every rank at this one point
            flow.comm.barrier()
        params = result.pop("params", {})
        np.savez(out / f"{run['name']}-{rank}.npz", **params)
        (out / f"{run['name']}-{rank}.json").write_text(json.dumps(result))
    if rank == 0:
        ref = reference(world)
        np.savez(out / "reference.npz", **ref["params"])
        np.savez(out / "start.npz", **ref["start"])
    flow.comm.barrier()  # no rank leaves while another still talks to it ("Machine 1 lost")
    sys.stdout.flush()
    os._exit(0)  # OneFlow 0.9's teardown can crash after the work is done


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
