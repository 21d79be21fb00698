"""One rank of tests/test_layouts_frameworks.py's OneFlow job: the real ``OneFlowTrainer``
trains a small MLP under each layout it is given, three SGD steps, and rank 0 writes
the full parameters each run ends at, and what one process reaches on the same global batch.

Run by OneFlow's own launcher (``python -m oneflow.distributed.launch --nproc_per_node 2
tests/layouts_frameworks_oneflow_rank.py OUT RUNS_JSON``); each run is ``{"name", "layout",
"compiler", "plan"}`` (``plan``: "megatron", or "colwise" for every Linear).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import oneflow as flow

from pytest_dlperf import SGD, Parts, Workload
from pytest_dlperf.core.parallel import parse_layout
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.frameworks import DistEnv, load

WIDTH, HIDDEN, BATCH, STEPS = 8, 64, 8, 3


def build(ctx: Any) -> Parts:
    """The same model on every rank; the global batch drawn once, each replica its share."""
    model = flow.nn.Sequential(flow.nn.Linear(WIDTH, HIDDEN), flow.nn.ReLU(),
                               flow.nn.Linear(HIDDEN, HIDDEN), flow.nn.ReLU(),
                               flow.nn.Linear(HIDDEN, 4))
    replicas = int(ctx.sizes["replicas"])
    data = np.random.RandomState(3)
    inputs = data.randn(BATCH * replicas, WIDTH)
    targets = data.randint(0, 4, BATCH * replicas)
    share = ctx.rank if ctx.layout is None else ctx.layout.data_rank(ctx.rank)
    rows = slice(share * ctx.batch_size, (share + 1) * ctx.batch_size)
    plan = {"megatron": {"0": "colwise", "2": "rowwise"},
            "head": {"0": "colwise", "2": "rowwise", "4": "colwise"},
            "colwise": {"0": "colwise", "2": "colwise", "4": "colwise"}}[str(ctx.sizes["plan"])]
    return Parts(model=model, inputs=flow.tensor(inputs[rows], dtype=flow.float32),
                 targets=flow.tensor(targets[rows], dtype=flow.int64),
                 plans={"tp": plan, "pp": ["2"]})


def workload(replicas: int, plan: str) -> Workload:
    return Workload("mlp", recipes={"oneflow": "layouts_frameworks_oneflow_rank:build"}, batch_size=BATCH,
                    sizes={"replicas": replicas, "plan": plan},
                    optimizer=SGD(lr_per_256=0.5 * 256 / BATCH, momentum=0.9), layouts=(
                        "dp", "fsdp", "tp", "pp"))


def train(spec: Any, dist: DistEnv, timed: int = 0) -> tuple[list[np.ndarray], float]:
    """The parameters after STEPS steps, gathered whole; then ms/step over ``timed`` more."""
    trainer = load("oneflow").build_trainer(spec, dist, build)
    for _ in range(STEPS):
        trainer.step()
    trainer.synchronize()
    assert 0 < trainer.loss() < 10, trainer.loss()  # readable on every rank, a pipeline's too
    everyone = flow.placement("cpu", ranks=list(range(flow.env.get_world_size())))
    out = []
    for param in trainer.params:
        if param.is_global:
            param = param.to_global(placement=everyone, sbp=flow.sbp.broadcast).to_local()
        out.append(param.numpy().copy())  # numpy() may share the memory the steps update
    began = time.perf_counter()
    for _ in range(timed):
        trainer.step()
    trainer.synchronize()
    return out, 1000 * (time.perf_counter() - began) / max(timed, 1)


def compare(params: list[np.ndarray], spec: Any, layout: Any) -> dict[str, float]:
    global_batch = BATCH * layout.data_parallel
    out = {}
    for key, batch in (("diff", global_batch), ("diff_half_batch", global_batch // 2)):
        one = spec_for("oneflow", workload(layout.data_parallel, spec.sizes["plan"]),
                       protocol=QUICK, device_type="cpu", batch_size=batch)
        reference, _ = train(one.with_(optimizer=spec.optimizer), DistEnv(0, 1, 0, 1, 0))
        out[key] = max(float(np.abs(a - b).max()) for a, b in zip(params, reference))
        if key == "diff":
            flow.manual_seed(one.seed)
            start = build(one.context(0, 1, 0, "cpu")).model.parameters()
            out["moved"] = max(float(np.abs(a.numpy() - b).max())
                               for a, b in zip(start, reference))
    return out


def main(out_dir: str, runs_json: str) -> None:
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    dist = DistEnv(rank, world, rank, world, 0)
    results: dict[str, Any] = {}
    for run in json.loads(runs_json):
        layout = parse_layout(run["layout"]).resolve(world)
        spec = spec_for("oneflow", workload(layout.data_parallel, run["plan"]), protocol=QUICK,
                        device_type="cpu", compiler=run["compiler"], layout=layout)
        try:
            params, ms = train(spec, dist, timed=20)
        except Exception as exc:  # noqa: BLE001 - the test reads what failed
            results[run["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        finally:
            # The layout's global tensors freed on every rank at this one point: left to the
            # garbage collector, a rank freed them at another time than the other (inside the
            # next layout's build, while rank 0 was in compare() below or at the barrier), and
            # a freeing that talks to the other rank hung (seen once the plugin allocated a
            # little more per layout, 2026-11-27).
            gc.collect()
            flow.comm.barrier()
        if rank == 0:
            # One process on the global batch, at the layout's learning rate; and, as the
            # control of a wrong data split, on its first half alone.
            results[run["name"]] = {"ms_per_step": ms, **compare(params, spec, layout)}
            Path(out_dir, "oneflow.json").write_text(json.dumps(results))
    if rank == 0:
        Path(out_dir, "oneflow.json").write_text(json.dumps(results))
    flow.comm.barrier()  # no rank leaves while another still talks to it ("Machine 1 lost")
    sys.stdout.flush()
    os._exit(0)  # OneFlow 0.9's teardown can crash after the work is done


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
