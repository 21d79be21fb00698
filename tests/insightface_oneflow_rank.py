"""One rank of OneFlow's InsightFace ranks job (tests/port_insightface.py's ``ONEFLOW_RUNS``, run
by tests/test_ports_ranks.py): the real ``OneFlowTrainer`` trains a small
InsightFace (the recipe's head and margin, a small backbone) under each run it is given (DDP, or
a ``pfc`` layout: the head's centres a global tensor split by class), three SGD steps in float64,
and each rank writes the whole parameters the run ends at (gathered from the global tensors), the
rows of the head it holds, each step's loss and, under Partial FC, the centres each step kept
beside the batch's classes; rank 0 also writes what one process with the whole head reaches on
the same global batch, and the loss one process takes over the centres Partial FC's first step
kept.

Run by OneFlow's own launcher (``python -m oneflow.distributed.launch --nproc_per_node 2
tests/insightface_oneflow_rank.py OUT RUNS_JSON``); each run is ``{"name", "layout" (or null:
DDP), "compiler", "options"}`` (``options``: ``{"wrong_split": 1}`` moves every centre of the
split head one class on, as a strategy that put the classes on the wrong ranks would).
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

# 23 classes: two ranks hold 12 and 11 (the first rank one more), more than a step's batch holds
SIZES = {"num_classes": 23, "embedding": 8, "backbone": "mobilefacenet", "margin": "arcface",
         "scale": 16.0, "image": 112}
BATCH, SEED, LR, STEPS = 6, 7, 0.1, 3
OPTIMIZER = OptimizerSpec(lr=LR, momentum=0.9, weight_decay=5e-4)


def spec_for(layout: Any, compiler: str, options: dict[str, Any]) -> RankSpec:
    return RankSpec(framework="oneflow", model="insightface", protocol=Protocol(0, STEPS, 1),
                    batch_size=BATCH, sizes={**SIZES, **options}, seed=SEED, compiler=compiler,
                    optimizer=OPTIMIZER, precision=PrecisionSpec(),
                    layout=None if layout is None else layout.to_json())


def recipe(ctx: Any) -> Any:
    """The recipe in float64 (``sizes["dtype"]``: OneFlow's DDP takes float32 only) with a small
    backbone in place of MobileFaceNet: no BatchNorm, whose statistics are a rank's batch's (one
    process's would be the global batch's)."""
    from pytest_dlperf.models.insightface.oneflow import recipe as insightface

    flow.set_default_dtype(flow.float64)  # float64 draws: float32's are other numbers
    flow.manual_seed(ctx.seed + 1)
    small = flow.nn.Sequential(flow.nn.AvgPool2d(16), flow.nn.Flatten(),
                               flow.nn.Linear(3 * 7 * 7, 16), flow.nn.PReLU(),
                               flow.nn.Linear(16, SIZES["embedding"]))
    parts = insightface(ctx, backbone=small)
    if ctx.sizes.get("dtype") != "float32":
        return parts
    draw = parts.inputs

    def narrowed() -> Any:
        images, labels = draw()
        return images.float(), labels

    return dataclasses.replace(parts, model=parts.model.float(), inputs=narrowed)


def names() -> list[str]:
    return [name for name, _ in recipe(BuildContext(
        "oneflow", "cpu", "cpu", BATCH, SIZES, "fp32", "float64", False, SEED, 0, 1, 0)
    ).model.named_parameters()]


def whole(tensor: Any, world: int) -> Any:
    """A parameter as one process holds it (numpy; a global one gathered)."""
    if tensor.is_global:
        everyone = flow.placement("cpu", ranks=list(range(world)))
        tensor = tensor.to_global(placement=everyone, sbp=flow.sbp.broadcast).to_local()
    return tensor.numpy().copy()  # numpy() may share the memory the steps update


def record_samples(head: Any, world: int) -> list[dict[str, Any]]:
    """Each step's kept centres, on this rank and on every rank, beside the batch's labels."""
    split, seen = head.split, []

    def recording(head: Any, embeddings: Any, labels: Any) -> Any:
        loss = split(head, embeddings, labels)
        everyone = split.sampled.to_global(placement=split.placement, sbp=flow.sbp.split(0))
        seen.append({"kept": split.sampled.numpy().tolist(),
                     "every": whole(everyone, world).tolist(),
                     "labels": whole(labels, world).tolist()})
        return loss

    head.split = recording
    return seen


def move_every_centre(head: Any, world: int) -> None:
    """Every class's centre moved one class on: the centres on the wrong classes and ranks."""
    moved = flow.tensor(np.roll(whole(head.weight, world), 1, axis=0))
    with flow.no_grad():
        head.weight.copy_(moved.to_global(placement=head.weight.placement,
                                          sbp=flow.sbp.broadcast).to_global(
            placement=head.weight.placement, sbp=head.weight.sbp))


def train(run: dict[str, Any], dist: DistEnv) -> dict[str, Any]:
    world = dist.world_size
    layout = parse_layout(run["layout"]).resolve(world) if run["layout"] else None
    options = run.get("options", {})
    trainer = load("oneflow").build_trainer(
        spec_for(layout, run.get("compiler", "eager"), options), dist, recipe)
    params = dict(zip(names(), trainer.params))
    seen: list[dict[str, Any]] = []
    if not trainer.graph:  # eager: the head module is at hand
        head = getattr(trainer.model, "module", trainer.model).head
        if options.get("wrong_split"):
            move_every_centre(head, world)
        if head.split is not None and head.split.ratio < 1:
            seen = record_samples(head, world)
    losses = []
    for _ in range(STEPS):
        trainer.step()
        losses.append(trainer.loss())
    trainer.synchronize()
    weight = params["head.weight"]
    return {"params": {name: whole(p, world).astype(np.float64) for name, p in params.items()},
            "losses": losses, "seen": seen, "environment": trainer.environment(),
            "head_rows": int((weight.to_local() if weight.is_global else weight).shape[0])}


def reference(world: int) -> dict[str, Any]:
    """One process, the whole head, on the global batch: rank r's batches are what the recipe
    draws for rank r."""
    from pytest_dlperf.frameworks.oneflow.update import make_optimizer

    parts = [recipe(BuildContext("oneflow", "cpu", "cpu", BATCH, SIZES, "fp32", "float64",
                                 False, SEED, rank, world, rank)) for rank in range(world)]
    model = parts[0].model
    sgd = make_optimizer(flow, list(model.parameters()), OPTIMIZER, graph=False)
    start = {n: p.numpy().copy() for n, p in model.named_parameters()}
    losses = []
    for _ in range(STEPS):
        batches = [p.inputs() for p in parts]
        images = flow.cat([b[0] for b in batches])
        labels = flow.cat([b[1] for b in batches])
        sgd.zero_grad()
        loss = model(images, labels)
        loss.backward()
        sgd.step()
        losses.append(float(loss))
    return {"params": {n: p.numpy().copy() for n, p in model.named_parameters()},
            "start": start, "losses": losses}


def partial_reference(world: int, kept: list[int]) -> float:
    """One process's loss of the first step over the centres ``kept`` (every rank's), each
    label its class's column among them: what Partial FC's first step computes."""
    parts = [recipe(BuildContext("oneflow", "cpu", "cpu", BATCH, SIZES, "fp32", "float64",
                                 False, SEED, rank, world, rank)) for rank in range(world)]
    model = parts[0].model
    batches = [p.inputs() for p in parts]
    labels = flow.cat([b[1] for b in batches]).numpy()
    column = {int(c): i for i, c in enumerate(kept)}
    target = flow.tensor([column[int(c)] for c in labels])
    with flow.no_grad():
        norm = flow.nn.functional.normalize
        embeddings = model.backbone(flow.cat([b[0] for b in batches]))
        weight = model.head.weight[flow.tensor(kept)]
        cosine = norm(embeddings, dim=1).matmul(norm(weight, dim=1).t())
        logits = model.head.logits(cosine, target)
        return float(flow.nn.functional.cross_entropy(logits, target))


def main(out_dir: str, runs_json: str) -> None:
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    dist = DistEnv(rank, world, rank, world, 0)
    out, results = Path(out_dir), {}
    for run in json.loads(runs_json):
        try:
            result = train(run, dist)
        except Exception as exc:  # noqa: BLE001 - the test reads what failed
            result = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            gc.collect()  # the run's global tensors freed on every rank at this one point
            flow.comm.barrier()
        results[run["name"]] = result
        np.savez(out / f"{run['name']}-{rank}.npz", **result.pop("params", {}))
        (out / f"{run['name']}-{rank}.json").write_text(json.dumps(result))
    if rank == 0:
        ref = reference(world)
        np.savez(out / "reference.npz", **ref["params"])
        np.savez(out / "start.npz", **ref["start"])
        partial = {name: partial_reference(world, result["seen"][0]["every"])
                   for name, result in results.items() if result.get("seen")}
        (out / "reference.json").write_text(json.dumps({"losses": ref["losses"],
                                                        "partial_first_loss": partial}))
    flow.comm.barrier()  # no rank leaves while another still talks to it ("Machine 1 lost")
    sys.stdout.flush()
    os._exit(0)  # OneFlow 0.9's teardown can crash after the work is done


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
