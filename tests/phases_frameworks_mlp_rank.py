"""One rank of tests/test_conformance_measured.py's phase checks: the real trainer of a
framework trains a small MLP a few steps, then runs the diagnostic steps in phases exactly as a
rank does after its timed windows (``rank.worker.diagnose_phases``) and prints the phases' JSON
and its weights (each tensor's sum), last line.

``python tests/phases_frameworks_mlp_rank.py FRAMEWORK COMPILERS STEPS [HIDDEN]`` (compilers:
``eager,compiled``; prints ``{compiler: {phases, weights}}``), with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` in the environment (and what the framework needs besides:
``DLPERF_FRAMEWORK_PORT`` for Paddle's store, ``DLPERF_TEST_WORKERS`` for TensorFlow's
workers). Runs under OneFlow's interpreter too: nothing here needs pytest.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

from pytest_dlperf import SGD, Parts, Workload
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.recipes import load_recipe
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.frameworks import DistEnv, load
from pytest_dlperf.rank.worker import diagnose_phases

WIDTH, CLASSES, BATCH, WARM_STEPS = 16, 4, 8, 2


def build_torchlike(nn: Any, ctx: Any) -> Any:
    hidden = int(ctx.sizes["hidden"])
    return nn.Sequential(nn.Linear(WIDTH, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, CLASSES))


def batch(ctx: Any) -> tuple[np.ndarray, np.ndarray]:
    """A batch of each rank's own: ranks whose gradients are not all-reduced drift apart."""
    data = np.random.RandomState(100 + ctx.rank)
    return (data.randn(ctx.batch_size, WIDTH).astype("float32"),
            data.randint(0, CLASSES, ctx.batch_size).astype("int64"))


def oneflow(ctx: Any) -> Parts:
    import oneflow as flow

    inputs, targets = batch(ctx)
    return Parts(model=build_torchlike(flow.nn, ctx), inputs=flow.tensor(inputs),
                 targets=flow.tensor(targets))


def paddle(ctx: Any) -> Parts:
    import paddle as pd

    hidden = int(ctx.sizes["hidden"])
    model = pd.nn.Sequential(pd.nn.Linear(WIDTH, hidden), pd.nn.ReLU(),
                             pd.nn.Linear(hidden, hidden), pd.nn.ReLU(),
                             pd.nn.Linear(hidden, CLASSES))
    inputs, targets = batch(ctx)
    return Parts(model=model, inputs=pd.to_tensor(inputs), targets=pd.to_tensor(targets))


def tensorflow(ctx: Any) -> Parts:
    import keras
    import tensorflow as tf

    hidden = int(ctx.sizes["hidden"])
    layer = keras.Input((WIDTH,))
    out = keras.layers.Dense(hidden, activation="relu")(layer)
    out = keras.layers.Dense(hidden, activation="relu")(out)
    inputs, targets = batch(ctx)
    # Constants the step reads: a variable made under the strategy's scope would start as
    # worker 0's on every worker.
    return Parts(model=keras.Model(layer, keras.layers.Dense(CLASSES)(out)),
                 inputs=lambda: tf.constant(inputs), targets=lambda: tf.constant(targets))


def weights(framework: str, trainer: Any) -> list[float]:
    """The sum of each trainable tensor, this rank's copy."""
    if framework == "tensorflow":
        return [float(v.numpy().sum()) for v in trainer.model.trainable_variables]
    if framework == "oneflow":
        return [float((p.to_local() if p.is_global else p).sum().numpy()) for p in trainer.params]
    return [float(p.sum()) for p in trainer.params]


def phases(framework: str, compiler: str, steps: int, hidden: int) -> Any:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    workload = Workload("mlp", recipes={framework: f"phases_frameworks_mlp_rank:{framework}"},
                        batch_size=BATCH, sizes={"hidden": hidden},
                        optimizer=SGD(lr_per_256=1.0, momentum=0.9))
    spec = spec_for(framework, workload, protocol=QUICK, device_type="cpu", compiler=compiler,
                    world_size=world)
    workers = os.environ.get("DLPERF_TEST_WORKERS")
    if workers:
        spec = spec.with_(workers=json.loads(workers))
    assert spec.recipe is not None
    trainer = load(framework).build_trainer(spec, DistEnv(rank, world, rank, world, 0),
                                            load_recipe(spec.recipe))
    for _ in range(WARM_STEPS):  # the timed windows' steps, before the diagnostic ones
        trainer.step()
    trainer.synchronize()
    found = {"phases": diagnose_phases(trainer, steps, world),
             "weights": weights(framework, trainer)}
    trainer.close()
    return found


if __name__ == "__main__":
    # One process may train several compilers' trainers one after the other (not TensorFlow's
    # on several workers: its strategy is set up once a process).
    print(json.dumps({compiler: phases(sys.argv[1], compiler, int(sys.argv[3]),
                                       int(sys.argv[4]) if len(sys.argv) > 4 else 32)
                      for compiler in sys.argv[2].split(",")}))
