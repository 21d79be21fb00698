"""Paddle's Wide & Deep is torch's (``wide_deep_torch.build``): the formula's parameters under
torch's names and shapes, torch's logits and loss from torch's weights, the same power-law ids
drawn afresh every step. That the recipe trains through the adapter, eager and under
to_static, is the port contract's row in tests/ports.py, run by tests/test_ports_trained.py.

Paddle runs in a subprocess in each (importing it beside TensorFlow, as the rest of the suite
does, crashes the process); torch's side is computed here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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


def test_the_formulas_parameters_under_torchs_names_and_shapes() -> None:
    torch = pytest.importorskip("torch")
    from pytest_dlperf.models.wide_deep import torch as wide_deep_torch

    sizes = wide_deep.WORKLOAD.sizes_for("cpu", "fp32")  # vocab 200k, as a CPU case builds it
    out = run_snippet(sys.executable, RECIPE + f"""
import math
parts = wide_deep_paddle.recipe(context({sizes!r}, 8))
model = parts.model
print(json.dumps({{"shapes": wide_deep_paddle.torch_named_shapes(model),
                  "trainable": sum(math.prod(p.shape) for p in model.parameters()
                                   if not p.stop_gradient)}}))
""")
    assert isinstance(out, dict)
    assert out["trainable"] == wide_deep.parameter_count(sizes) == 4_890_945
    torch_model = wide_deep_torch.build(wide_deep.WideDeepShape.of(sizes), device="meta")
    torch_shapes = {n: list(p.shape) for n, p in torch_model.named_parameters()}
    assert out["shapes"] == torch_shapes
    assert list(out["shapes"]) == list(torch_shapes)  # and in torch's order
    del torch


def test_torchs_weights_give_torchs_logits_and_loss(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import numpy as np

    from pytest_dlperf.models.wide_deep import torch as wide_deep_torch

    shape = wide_deep.WideDeepShape.of(SMALL)
    torch.manual_seed(0)
    reference = wide_deep_torch.build(shape).eval()  # no dropout on either side
    generator = torch.Generator().manual_seed(1)
    batch = 64
    dense = torch.rand(batch, shape.dense_fields, generator=generator)
    wide = wide_deep_torch.power_law_ids(shape, batch, shape.wide_slots, shape.deep_slots,
                                         generator, "cpu")
    deep = wide_deep_torch.power_law_ids(shape, batch, shape.deep_slots, 0, generator, "cpu")
    clicks = torch.randint(0, 2, (batch,), generator=generator).float()
    with torch.no_grad():
        logits = reference(dense, wide, deep)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, clicks)
    np.savez(tmp_path / "ref.npz", dense=dense.numpy(), wide=wide.numpy(), deep=deep.numpy(),
             clicks=clicks.numpy(), logits=logits.numpy(), loss=loss.numpy(),
             **{f"param/{n}": p.detach().numpy() for n, p in reference.named_parameters()})
    out = run_snippet(sys.executable, f"""
import json
import numpy as np
import paddle
from pytest_dlperf.models.wide_deep import paddle as wide_deep_paddle
from pytest_dlperf.models.wide_deep import WideDeepShape
ref = np.load({str(tmp_path / "ref.npz")!r})
model = wide_deep_paddle.build(WideDeepShape.of({SMALL!r}))
model.eval()
wide_deep_paddle.load_torch_weights(model, {{k.removeprefix("param/"): ref[k]
                                            for k in ref.files if k.startswith("param/")}})
with paddle.no_grad():
    logits = model(*(paddle.to_tensor(ref[k]) for k in ("dense", "wide", "deep")))
    loss = wide_deep_paddle.click_loss(logits, paddle.to_tensor(ref["clicks"]))
print(json.dumps({{"logits": float(np.abs(logits.numpy() - ref["logits"]).max()),
                  "loss": float(abs(float(loss) - float(ref["loss"])))}}))
""")
    # float32 on both sides, measured 6.0e-8 apart (logits up to 0.22; the loss, 0.69,
    # 6.0e-8). A tower without its ReLUs moves the logits by
    # 3.0e-1, the wide logit left out by 8.8e-2.
    assert isinstance(out, dict)
    assert out["logits"] < 1e-6 and out["loss"] < 1e-6, out


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
