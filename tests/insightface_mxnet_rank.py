"""One rank of MXNet's InsightFace ranks jobs (tests/port_insightface.py's ``MXNET_RUNS``, run by
tests/test_ports_ranks.py), under MXNet's interpreter:
the real ``MXNetTrainer`` trains a small InsightFace (the recipe's head and margin, a small
backbone without BatchNorm) three SGD steps (momentum, weight decay) in float64 under the layout
it is given, and writes (``OUT/NAME-RANK.json`` and ``.npz``) the parameters it ends at (its own
rows of the head), its losses, its environment and, under Partial FC, the centres each step kept
beside the global batch's labels. ``reference`` trains one process with the whole head on the
runs' global batch the same way.

``python tests/insightface_mxnet_rank.py OUT NAME LAYOUT RANK WORLD OPTIONS_JSON`` (LAYOUT
``none`` for one process with the whole head); the store's variables (MASTER_ADDR,
DLPERF_FRAMEWORK_PORT) come from the environment.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

# 11 classes: two ranks hold 6 and 5 (the first rank one more)
SIZES = {"num_classes": 11, "embedding": 8, "backbone": "mobilefacenet", "margin": "arcface",
         "scale": 16.0, "image": 112}
GLOBAL, SEED, LR, STEPS = 6, 7, 0.1, 3


def backbone() -> Any:
    """A small backbone in place of MobileFaceNet: no BatchNorm, whose statistics are a
    rank's batch's (one process's would be the global batch's)."""
    import mxnet as mx

    nn, seq = mx.gluon.nn, mx.gluon.nn.HybridSequential()
    seq.add(nn.AvgPool2D(16), nn.Flatten(), nn.Dense(16, in_units=3 * 7 * 7),
            nn.PReLU(in_channels=16), nn.Dense(SIZES["embedding"], in_units=16))
    return seq


def recipe(ctx: Any) -> Any:
    """The InsightFace recipe's model in float64; rank r's rows of a global batch of
    ``GLOBAL`` (one process with a batch of ``GLOBAL``: all of them), labels drawn per step."""
    import mxnet as mx

    from pytest_dlperf.models.insightface.mxnet import recipe as insightface

    parts = insightface(ctx, backbone=backbone())
    parts.model.cast("float64")
    rows = slice(ctx.rank * ctx.batch_size, (ctx.rank + 1) * ctx.batch_size)
    images = mx.nd.array(np.random.RandomState(SEED).randn(GLOBAL, 3, 112, 112)[rows],
                         dtype="float64")
    drawn: list[Any] = []

    def fresh() -> Any:
        drawn.append(labels_of(len(drawn))[rows])
        return images, mx.nd.array(drawn[-1], dtype="float64")

    return dataclasses.replace(parts, inputs=fresh, targets=lambda: None)


def labels_of(step: int) -> Any:
    return np.random.RandomState(SEED + 1 + step).randint(0, SIZES["num_classes"], GLOBAL)


def spec_for(layout: Any, batch: int, compiler: str = "eager") -> Any:
    from pytest_dlperf.core.protocol import Protocol
    from pytest_dlperf.core.spec import OptimizerSpec, PrecisionSpec, RankSpec

    return RankSpec(framework="mxnet", model="insightface", protocol=Protocol(0, STEPS, 1),
                    batch_size=batch, sizes=SIZES, seed=SEED, compiler=compiler,
                    optimizer=OptimizerSpec(lr=LR, momentum=0.9, weight_decay=5e-4),
                    precision=PrecisionSpec(),
                    layout=None if layout is None else layout.to_json())


def train(out: Path, name: str, layout_text: str, rank: int, world: int,
          options: dict[str, Any]) -> None:
    from pytest_dlperf.core.parallel import parse_layout
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.frameworks.mxnet import build_trainer
    from pytest_dlperf.models.insightface.mxnet import named_parameters

    layout = None if layout_text == "none" else parse_layout(layout_text).resolve(world)
    trainer = build_trainer(spec_for(layout, GLOBAL // world, options.get("compiler", "eager")),
                            DistEnv(rank, world, rank, world, 0), recipe)
    head = trainer.model.head
    if options.get("wrong_offset") and head.split is not None:  # rank 1 reads its labels
        head.split.start = 0  # as if its classes began at 0
    params = named_parameters(trainer.model)
    start = {n: p.data().asnumpy() for n, p in params.items()}
    losses, seen = [], []
    for step in range(STEPS):
        trainer.step()
        trainer.synchronize()
        losses.append(trainer.loss())
        if head.split is not None and head.split.sampled is not None:
            seen.append({"kept": head.split.sampled.tolist(), "labels": labels_of(step).tolist()})
    np.savez(out / f"{name}-{rank}.npz", **{n: p.data().asnumpy() for n, p in params.items()})
    np.savez(out / f"{name}-{rank}-start.npz", **start)
    (out / f"{name}-{rank}.json").write_text(json.dumps({
        "losses": losses, "environment": trainer.environment(), "seen": seen,
        "head_rows": head.weight.shape[0]}))
    trainer.close()


if __name__ == "__main__":
    train(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
          json.loads(sys.argv[6]))
    print("{}")
