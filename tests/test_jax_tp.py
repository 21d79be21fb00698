"""Tensor parallelism in the JAX adapter (``frameworks/jax/tp.py``): the GPT recipe's plan as
shardings over a ``tp`` mesh axis and a step XLA partitions, checked against one process as
torch's layouts are (``tests/test_layouts_torch.py``). Real JAX processes in its distributed
runtime, under JAX's own interpreter (the tests skip without it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from snippets import free_ports, run_snippet, run_together

REPO = Path(__file__).resolve().parents[1]

# Two steps of the CPU GPT, SGD with a clip that binds (AdamW's normalized update would hide a
# wrongly scaled gradient, as torch's test notes), every parameter whole on every rank after.
STEP = """
import dataclasses, json
import numpy as np
from pytest_dlperf import SGD
from pytest_dlperf.core.parallel import parse_layout
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.recipes import load_recipe
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.frameworks import DistEnv, load
from pytest_dlperf.models import gpt
workload = dataclasses.replace(gpt.WORKLOAD, optimizer=SGD(lr_per_256=64.0, momentum=0.9,
                                                           clip_norm=0.05))
spec = spec_for("jax", workload, protocol=QUICK, device_type="cpu", compiler="compiled",
                world_size=WORLD, layout=parse_layout(LAYOUT).resolve(WORLD) if LAYOUT else None)
trainer = load("jax").build_trainer(spec, DistEnv(RANK, WORLD, RANK, WORLD, 0),
                                    load_recipe(spec.recipe))
from jax.experimental import multihost_utils
def weights():
    return [np.asarray(multihost_utils.process_allgather(p, tiled=True)) for p in trainer.params]
before = weights()
losses = []
for _ in range(2):
    trainer.step()
    losses.append(trainer.loss())
after = weights()
shapes = sorted({(tuple(p.shape), tuple(p.addressable_data(0).shape)) for p in trainer.params})
env = trainer.environment()
trainer.close()
np.savez(OUT, *after)  # ~3.5 MB: through a pipe, a rank blocked on it held its peer's exit
print(json.dumps({"losses": losses,
                  "moved": [float(np.abs(a - b).max()) for a, b in zip(after, before)],
                  "shapes": shapes, "ranks": env["data_parallel_ranks"],
                  "parameters": env["parameters"]}))
"""


def head(rank: int, world: int, layout: str | None, out: Path) -> str:
    return f"RANK, WORLD, LAYOUT, OUT = {rank}, {world}, {layout!r}, {str(out)!r}\n"


def weights(path: Path) -> list[Any]:
    import numpy as np

    with np.load(path) as saved:
        return [saved[name] for name in saved.files]


def test_two_tensor_parallel_ranks_train_what_one_process_trains(jax_python: str,
                                                                 tmp_path: Path) -> None:
    """tp2: each rank holds half of every matrix the plan names (the attention's heads and
    the MLP's hidden units by columns, their output projections and the vocabulary by rows),
    trains on the same tokens (one replica), and after two clipped SGD steps both hold what one
    process holds, within float32's reassociation (measured: 6e-8, the largest weight 1.0)."""
    ports = free_ports(2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports[0]),
           "DLPERF_FRAMEWORK_PORT": str(ports[1])}
    ranks: list[Any] = run_together(
        jax_python, [head(rank, 2, "tp", tmp_path / f"tp{rank}.npz") + STEP for rank in (0, 1)],
        env, timeout=600)
    alone: Any = run_snippet(jax_python, head(0, 1, None, tmp_path / "one.npz") + STEP,
                             timeout=600)
    assert [r["ranks"] for r in ranks] == [1, 1]  # one replica
    assert ranks[0]["parameters"] == alone["parameters"]
    halves = {tuple(map(tuple, pair)) for pair in ranks[0]["shapes"]}
    # hidden 128, MLP 512, vocabulary 512: Q/K/V by columns, their output by rows, w1 by
    # columns, w2 by rows, the embedding by rows; the norms and positions whole.
    assert {((128, 128), (128, 64)), ((128, 128), (64, 128)), ((128, 512), (128, 256)),
            ((512, 128), (256, 128)), ((512,), (256,)), ((128,), (64,)),
            ((128,), (128,)), ((64, 128), (64, 128))} == halves
    assert ranks[0]["losses"] == pytest.approx(alone["losses"], rel=1e-6)
    assert max(alone["moved"]) > 1e-3  # the steps moved the weights: the match means something
    one = weights(tmp_path / "one.npz")
    for rank in (0, 1):
        apart = [float(abs(got - want).max())
                 for got, want in zip(weights(tmp_path / f"tp{rank}.npz"), one)]
        assert len(apart) == len(one) and max(apart) < 2e-6, apart


def test_fsdp_with_tp_is_refused_saying_what_runs(jax_python: str) -> None:
    out = run_snippet(jax_python, """
import json
from pytest_dlperf.core.strategies import why_not
from pytest_dlperf.frameworks import load
load("jax")  # registers its strategies
print(json.dumps([why_not("jax", kinds, "cpu", True)
                  for kinds in (("tp",), ("dp", "tp"), ("fsdp", "tp"), ("pp",))]))
""")
    assert isinstance(out, list)
    tp, dp_tp, fsdp_tp, pp = out
    assert tp is None and dp_tp is None
    assert "tp with dp, not with fsdp" in fsdp_tp
    assert "pp is not ported" in pp
