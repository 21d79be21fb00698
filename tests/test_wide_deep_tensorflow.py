"""The TensorFlow recipe's Wide & Deep is torch's (``wide_deep_torch.build``): the formula's
parameters under torch's names and shapes and torch's logits and loss from torch's weights are
the port contract's (tests/ports.py, checked in tests/test_ports.py); here, the same power-law
ids, drawn by TensorFlow ops inside the step, afresh every step, the seed's weights, and the
adapter's AdamW against torch's. That the recipe trains through the adapter, eager and under
XLA, is the port contract's row too, run by tests/test_ports_trained.py."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from snippets import run_snippet

# torch before TensorFlow: importing torch after TensorFlow segfaults with tensorflow-cpu 2.21 +
# torch 2.14 (see test_tensorflow.py).
torch = pytest.importorskip("torch")
pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install "
                                         "'pytest-dlperf[tensorflow]')")

from pytest_dlperf.core.workload import BuildContext  # noqa: E402
from pytest_dlperf.models import wide_deep  # noqa: E402
from pytest_dlperf.models.wide_deep import tensorflow as wide_deep_tensorflow  # noqa: E402

# Small enough to build in a moment, with every part of the model: 2 hidden layers.
SMALL = {**wide_deep.WORKLOAD.sizes_for("cpu", "fp32"), "vocab": 5_000, "hidden_size": 64}


def context(sizes: dict[str, Any], batch: int = 8, seed: int = 0) -> BuildContext:
    return BuildContext("tensorflow", "cpu", "cpu", batch, sizes, "fp32", "float32", False,
                        seed, 0, 1, 0)


def test_ids_are_drawn_in_the_step_skewed_each_slots_hot_rows_apart() -> None:
    import numpy as np
    import tensorflow as tf

    shape = wide_deep.WideDeepShape.of(SMALL)
    parts = wide_deep_tensorflow.recipe(context(SMALL, batch=4096))
    step = tf.function(lambda: (parts.inputs(), parts.targets()))  # as the adapter traces them
    (dense, wide, deep), clicks = step()
    (_, _, later), _ = step()
    assert dense.shape == (4096, 13) and wide.shape == (4096, 2) and deep.shape == (4096, 26)
    ids = np.concatenate([deep.numpy(), wide.numpy()], axis=1)  # slots 0..25, then 26, 27
    assert deep.dtype == wide.dtype == tf.int64 and 0 <= ids.min() and ids.max() < shape.vocab
    # Each slot's hottest row is its own: id 0 of the power law, moved to slot s * (vocab // 28).
    hottest = [int(np.bincount(ids[:, s]).argmax()) for s in range(28)]
    assert hottest == [s * (shape.vocab // 28) for s in range(28)]
    # Skewed: a slot's hottest row takes far more than a uniform draw's 4096 / 5000.
    assert np.bincount(ids[:, 0]).max() > 100
    assert not np.array_equal(later.numpy(), deep.numpy())  # drawn afresh every step
    assert set(np.unique(clicks.numpy())) == {0.0, 1.0}


def test_the_case_seed_decides_the_weights_tables_uniform_within_a_twentieth() -> None:
    import numpy as np

    shape = wide_deep.WideDeepShape.of(SMALL)
    one, again, other = (wide_deep_tensorflow.build(shape, seed) for seed in (0, 0, 1))
    for a, b, c in zip(one.trainable_weights, again.trainable_weights, other.trainable_weights):
        assert np.array_equal(a.numpy(), b.numpy()), a.path
        assert "bias" in a.path or not np.array_equal(a.numpy(), c.numpy()), a.path
    deep, wide = (one.get_layer(name).embeddings.numpy()
                  for name in ("deep_embedding", "wide_embedding"))
    assert 0.045 < np.abs(deep).max() <= 0.05 and not np.array_equal(deep[:, :1], wide)


# Three AdamW steps from torch's weights on the same batches, torch's first (torch after
# TensorFlow's import crashed here), then the TensorFlow adapter's optimizer.
ADAMW_STEPS = """
import json, torch
from pytest_dlperf.core.spec import OptimizerSpec  # noqa: E402
from pytest_dlperf.models import wide_deep  # noqa: E402
from pytest_dlperf.models.wide_deep import torch as wide_deep_torch  # noqa: E402
sizes = {**wide_deep.WORKLOAD.sizes_for("cpu", "fp32"), "vocab": 5_000, "hidden_size": 64,
         "dropout": 0.0}
shape = wide_deep.WideDeepShape.of(sizes)
spec = OptimizerSpec(lr=1e-3, kind="adamw", betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
torch.manual_seed(0)
model = wide_deep_torch.build(shape)
start = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
generator = torch.Generator().manual_seed(1)
batches = []
for _ in range(3):
    batches.append((torch.rand(64, 13, generator=generator),
                    wide_deep_torch.power_law_ids(shape, 64, 2, 26, generator, "cpu"),
                    wide_deep_torch.power_law_ids(shape, 64, 26, 0, generator, "cpu"),
                    torch.randint(0, 2, (64,), generator=generator).float()))
adamw = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=spec.betas, eps=spec.eps,
                          weight_decay=spec.weight_decay)
for dense, wide, deep, clicks in batches:
    adamw.zero_grad()
    torch.nn.functional.binary_cross_entropy_with_logits(model(dense, wide, deep),
                                                         clicks).backward()
    adamw.step()
ended = {n: p.detach().numpy() for n, p in model.named_parameters()}

import keras, tensorflow as tf
from pytest_dlperf.frameworks.tensorflow import make_optimizer  # noqa: E402
from pytest_dlperf.models.wide_deep import tensorflow as ours  # noqa: E402
keras_model = ours.build(shape)
ours.load_torch_weights(keras_model, start)
variables = keras_model.trainable_variables
optimizer = make_optimizer(keras, variables, spec)
for dense, wide, deep, clicks in batches:
    with tf.GradientTape() as tape:
        loss = ours.click_loss(keras_model((dense.numpy(), wide.numpy(), deep.numpy()),
                                           training=True), clicks.numpy())
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
named = ours._torch_named_weights(keras_model)
out = {}
for name, value in ended.items():
    weight = named[name].numpy()
    weight = weight.T if named[name].path.endswith("/kernel") else weight
    moved = abs(value - start[name]).max()
    out[name] = float(abs(weight - value).max() / moved)
print(json.dumps(out))
"""


def test_the_adapters_adamw_updates_as_torchs() -> None:
    # Keras' own AdamW adds epsilon before the bias correction and applies a lookup's
    # IndexedSlices row by row: it ended 1.02 of torch's move apart (deep table; the tower
    # 0.75). The adapter's (_tensorflow_adamw) measured 6.7e-4 at most (float32, the deep table
    # with its small gradients).
    out = run_snippet(sys.executable, ADAMW_STEPS)
    assert isinstance(out, dict) and set(out) >= {"deep_embedding.weight", "tower.0.weight"}
    assert max(out.values()) < 2e-3, out
