"""Paddle's Wide & Deep is torch's (``wide_deep_torch.build``): the formula's parameters under
torch's names and shapes and torch's logits and loss from torch's weights are the port
contract's (tests/ports.py, checked in tests/test_ports.py); here, the same power-law ids drawn
afresh every step. That the recipe trains through the adapter, eager and under to_static, is
the port contract's row too, run by tests/test_ports_trained.py.

Paddle runs in a subprocess (importing it beside TensorFlow, as the rest of the suite does,
crashes the process).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

if importlib.util.find_spec("paddle") is None:
    pytest.skip("PaddlePaddle is not installed (pip install 'pytest-dlperf[paddle]')",
                allow_module_level=True)

from snippets import run_snippet  # noqa: E402

from pytest_dlperf.models import wide_deep  # noqa: E402

# Small enough to build in a moment, with every part of the model: 2 hidden layers.
SMALL = {**wide_deep.WORKLOAD.sizes_for("cpu", "fp32"), "vocab": 5_000, "hidden_size": 64}

RECIPE = """
import json
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models.wide_deep import paddle as wide_deep_paddle
def context(sizes, batch):
    return BuildContext("paddle", "cpu", "cpu", batch, sizes, "fp32", "float32", False, 0, 0, 1,
                        0)
"""


def test_ids_are_drawn_every_step_skewed_each_slots_hot_rows_apart() -> None:
    vocab = int(SMALL["vocab"])
    out = run_snippet(sys.executable, RECIPE + f"""
import numpy as np
parts = wide_deep_paddle.recipe(context({SMALL!r}, 4096))
dense, wide, deep = parts.inputs()
later = parts.inputs()[2]
ids = np.concatenate([deep.numpy(), wide.numpy()], axis=1)  # slots 0..25, then 26, 27
print(json.dumps({{"shapes": [dense.shape, wide.shape, deep.shape],
                  "dtypes": [str(wide.dtype), str(deep.dtype)],
                  "range": [int(ids.min()), int(ids.max())],
                  "hottest": [int(np.bincount(ids[:, s]).argmax()) for s in range(28)],
                  "hottest_count": int(np.bincount(ids[:, 0]).max()),
                  "fresh": not np.array_equal(later.numpy(), deep.numpy()),
                  "clicks": sorted(set(parts.targets().numpy().tolist()))}}))
""")
    assert isinstance(out, dict)
    assert out["shapes"] == [[4096, 13], [4096, 2], [4096, 26]]
    assert out["dtypes"] == ["paddle.int64"] * 2
    assert 0 <= out["range"][0] and out["range"][1] < vocab
    # Each slot's hottest row is its own: id 0 of the power law, moved to slot s * (vocab // 28).
    assert out["hottest"] == [s * (vocab // 28) for s in range(28)]
    assert out["hottest_count"] > 100  # a uniform draw's: 4096 / 5000
    assert out["fresh"] and out["clicks"] == [0.0, 1.0]
