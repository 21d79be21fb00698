"""One rank of tests/test_layouts_frameworks.py's Paddle job: the real ``PaddleTrainer`` trains
a small MLP in float64 under each layout it is given, three SGD steps, and rank 0 writes the
full parameters each run ends at against what one process reaches on the same batch.

Started as the plugin's launchers start Paddle's ranks (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``DLPERF_FRAMEWORK_PORT`` in the environment): ``python
tests/layouts_frameworks_paddle_rank.py OUT RUNS_JSON``; each run is ``{"name", "layout",
"compiler", "plan"}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from pytest_dlperf import SGD, Parts, Workload
from pytest_dlperf.core.parallel import parse_layout
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.frameworks import DistEnv, load

WIDTH, HIDDEN, BATCH, STEPS = 8, 64, 8, 3
PLANS = {"megatron": {"0": "colwise", "2": "rowwise"},
         "colwise": {"0": "colwise", "2": "colwise", "4": "colwise"}}


def build(ctx: Any) -> Parts:
    """The same model on every rank (the adapter seeds it), one batch all ranks share."""
    import paddle

    paddle.set_default_dtype("float64")
    model = paddle.nn.Sequential(paddle.nn.Linear(WIDTH, HIDDEN), paddle.nn.ReLU(),
                                 paddle.nn.Linear(HIDDEN, HIDDEN), paddle.nn.ReLU(),
                                 paddle.nn.Linear(HIDDEN, 4))
    data = np.random.RandomState(3)
    inputs, targets = data.randn(BATCH, WIDTH), data.randint(0, 4, BATCH)
    rows = slice(0, ctx.batch_size)  # the reference's control: the first half alone
    return Parts(model=model, inputs=paddle.to_tensor(inputs[rows]),
                 targets=paddle.to_tensor(targets[rows], dtype="int64"),
                 plans={"tp": PLANS[str(ctx.sizes["plan"])]})


def workload(plan: str) -> Workload:
    return Workload("mlp", recipes={"paddle": "layouts_frameworks_paddle_rank:build"},
                    batch_size=BATCH, sizes={"plan": plan}, layouts=("dp", "fsdp", "tp", "pp"),
                    optimizer=SGD(lr_per_256=0.5 * 256 / BATCH, momentum=0.9))


def train(spec: Any, dist: DistEnv, timed: int = 0) -> tuple[list[np.ndarray], float]:
    """The parameters after STEPS steps, gathered whole; then ms/step over ``timed`` more."""
    import paddle

    trainer = load("paddle").build_trainer(spec, dist, build)
    for _ in range(STEPS):
        trainer.step()
    assert 0 < trainer.loss() < 10, trainer.loss()
    out = []
    for param in trainer.params:
        if param.is_dist():
            param = paddle.distributed.reshard(param, param.process_mesh,
                                               [paddle.distributed.Replicate()])._local_value()
        out.append(param.numpy().copy())
    began = time.perf_counter()
    for _ in range(timed):
        trainer.step()
    return out, 1000 * (time.perf_counter() - began) / max(timed, 1)


def compare(params: list[np.ndarray], spec: Any) -> dict[str, float]:
    out = {}
    for key, batch in (("diff", BATCH), ("diff_half_batch", BATCH // 2)):
        one = spec_for("paddle", workload(spec.sizes["plan"]), protocol=QUICK,
                       device_type="cpu", batch_size=batch)
        reference, _ = train(one.with_(optimizer=spec.optimizer), DistEnv(0, 1, 0, 1, 0))
        out[key] = max(float(np.abs(a - b).max()) for a, b in zip(params, reference))
    import paddle

    paddle.seed(spec.seed)
    start = build(spec.context(0, 1, 0, "cpu")).model.parameters()
    out["moved"] = max(float(np.abs(a.numpy() - b).max()) for a, b in zip(start, reference))
    return out


def main(out_dir: str, runs_json: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist = DistEnv(rank, world, rank, world, 0)
    results: dict[str, Any] = {}
    for run in json.loads(runs_json):
        layout = parse_layout(run["layout"]).resolve(world)
        spec = spec_for("paddle", workload(run["plan"]), protocol=QUICK, device_type="cpu",
                        compiler=run["compiler"], layout=layout)
        try:
            params, ms = train(spec, dist, timed=20)
        except Exception as exc:  # noqa: BLE001 - the test reads what failed
            results[run["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        if rank == 0:
            results[run["name"]] = {"ms_per_step": ms, **compare(params, spec)}
    if rank == 0:
        Path(out_dir, "paddle.json").write_text(json.dumps(results))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(sys.argv[1], sys.argv[2])
