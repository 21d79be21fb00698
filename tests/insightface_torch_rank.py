"""One rank of torch's InsightFace ranks job (tests/port_insightface.py's ``TORCH_RUNS``, run by
tests/test_ports_ranks.py): the real ``TorchTrainer`` trains a small
InsightFace (the recipe's head and margin, a small backbone) under each layout it is given, three
SGD steps in float64, and writes the whole head it ends at, gathered from the ranks' classes, the
backbone, what each rank's head holds, and under Partial FC the centres each step kept beside the
batch's classes; rank 0 also writes what one process with the whole head reaches on the same
global batch.

Run by torchrun (``python -m torch.distributed.run --nproc-per-node 2
tests/insightface_torch_rank.py OUT RUNS_JSON``); each run is a fresh world of its ``world``
processes (the others wait), as in tests/layouts_torch_rank.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from layouts_torch_rank import end, run_each

# 11 classes: two ranks hold 6 and 5 (the first rank one more)
SIZES = {"num_classes": 11, "embedding": 8, "backbone": "mobilefacenet", "margin": "arcface",
         "scale": 16.0, "image": 112}
BATCH, SEED, LR = 6, 7, 0.1


def backbone() -> Any:
    """A small backbone in place of MobileFaceNet: no BatchNorm, whose statistics are a
    replica's batch's (one process's would be the global batch's)."""
    return torch.nn.Sequential(torch.nn.AvgPool2d(16), torch.nn.Flatten(),
                               torch.nn.Linear(3 * 7 * 7, 16), torch.nn.PReLU(),
                               torch.nn.Linear(16, SIZES["embedding"]))


def spec_for(layout: Any, sizes: dict[str, Any]) -> Any:
    from pytest_dlperf.core.protocol import Protocol
    from pytest_dlperf.core.spec import OptimizerSpec, PrecisionSpec, RankSpec

    return RankSpec(framework="torch", model="insightface", protocol=Protocol(0, 3, 1),
                    batch_size=BATCH, sizes=sizes, seed=SEED, compiler="eager",
                    optimizer=OptimizerSpec(lr=LR, momentum=0.9, weight_decay=5e-4),
                    precision=PrecisionSpec(),
                    layout=None if layout is None else layout.to_json())


def recipe(ctx: Any) -> Any:
    from pytest_dlperf.models.insightface.torch import recipe as insightface

    torch.set_default_dtype(torch.float64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed + 1)
        small = backbone()
    return insightface(ctx, backbone=small)


def head_of(trainer: Any) -> Any:
    model = trainer.model_parts[0]
    return getattr(model, "module", model).head


def record_samples(head: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's kept centres on this rank beside the global batch's labels."""
    split, seen = head.split, []
    call = split.__call__

    def recording(head: Any, embeddings: Any, labels: Any) -> Any:
        loss = call(head, embeddings, labels)
        parts = [torch.empty_like(labels) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(parts, labels)
        seen.append((split.sampled.clone(), torch.cat(parts)))
        return loss

    head.split = recording
    return seen


def train(layout_text: str | None, world: int, options: dict[str, Any]) -> dict[str, Any]:
    from pytest_dlperf.core.parallel import parse_layout
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.frameworks.torch import build_trainer

    layout = parse_layout(layout_text).resolve(world) if layout_text else None
    trainer = build_trainer(spec_for(layout, SIZES), DistEnv.from_environ(dict(os.environ)),
                            recipe)
    try:
        head = head_of(trainer)
        split = head.split
        if options.get("wrong_offset"):  # every rank reads the labels as if it held class 0 on
            split.start = 0
        seen = record_samples(head) if split is not None and split.ratio < 1 else []
        for _ in range(3):
            trainer.step()
        mine = (split.start if split else 0, trainer.loss(), head.weight.detach().clone(),
                {n: p.detach().clone() for n, p in trainer.model_parts[0].named_parameters()
                 if not n.endswith("head.weight")})
        gathered: list[Any] = [mine]
        if world > 1:
            gathered = [None] * world
            torch.distributed.all_gather_object(gathered, mine)
        env = trainer.environment()
    finally:
        trainer.close()
    # The whole head, from each rank's classes (rank order is class order).
    whole = torch.cat([rows for _, _, rows, _ in sorted(gathered, key=lambda g: g[0])]) \
        if split is not None else gathered[0][2]
    params = {n.removeprefix("module."): p for n, p in gathered[0][3].items()}
    params["head.weight"] = whole
    return {"params": params, "environment": env, "seen": seen,
            "losses": [loss for _, loss, _, _ in gathered],
            "head_rows": [rows.shape[0] for _, _, rows, _ in gathered]}


def reference(world: int) -> dict[str, Any]:
    """One process, the whole head, on the global batch: rank r's batches are what the recipe
    draws for rank r."""
    from pytest_dlperf.core.spec import OptimizerSpec
    from pytest_dlperf.core.workload import BuildContext
    from pytest_dlperf.frameworks.torch import make_optimizer

    parts = [recipe(BuildContext("torch", "cpu", "cpu", BATCH, SIZES, "fp32", "float64", False,
                                 SEED, rank, world, rank)) for rank in range(world)]
    model = parts[0].model
    sgd = make_optimizer(torch, list(model.parameters()),
                         OptimizerSpec(lr=LR, momentum=0.9, weight_decay=5e-4),
                         fused=False)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    for _ in range(3):
        batches = [p.inputs() for p in parts]
        images = torch.cat([b[0] for b in batches])
        labels = torch.cat([b[1] for b in batches])
        sgd.zero_grad()
        loss = model(images, labels)
        loss.backward()
        sgd.step()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "start": start, "loss": float(loss)}


def main() -> None:
    out, runs = Path(sys.argv[1]), json.loads(sys.argv[2])
    if run_each(out, runs, train) == 0:
        for world in sorted({run["world"] for run in runs}):
            torch.save(reference(world), out / f"reference-{world}.pt")
    end()


if __name__ == "__main__":
    main()
