"""MXNet's BERT trains: the recipe eager, hybridized and under AMP, in a loop written here.

``pytest_dlperf.models.bert.mxnet`` writes BERT from Gluon blocks (GluonNLP's is not used).
That it is torch's (the same parameters under the same names, the decoder tied, the same
outputs from torch's weights, eager and hybridized) is the port contract's, tests/ports.py's
row, checked by tests/test_ports.py. These tests run under MXNet's interpreter
(``scripts/setup-mxnet``, or ``DLPERF_TEST_MXNET_PYTHON``) and skip without it.
"""

from __future__ import annotations

import math

import pytest
from snippets import run_snippet

from pytest_dlperf.frameworks.mxnet import amp_unavailable

VOCAB = 30522


TRAIN = """
import json
import mxnet as mx
from mxnet import autograd, gluon
if precision == "amp":
    from mxnet.contrib import amp
    amp.init(target_dtype="bfloat16")  # before the model is built, as the adapter does
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models import BERT_BASE
from pytest_dlperf.models.bert.mxnet import recipe
mx.random.seed(0)
ctx = BuildContext(framework="mxnet", device_type="cpu", device="cpu",
                   batch_size=BERT_BASE.batch_for("cpu", precision),
                   sizes=BERT_BASE.sizes_for("cpu", precision), precision=precision,
                   amp_dtype="bfloat16" if precision == "amp" else "float32", compiled=True,
                   seed=0, rank=0, world_size=1, local_rank=0)
parts = recipe(ctx)
model = parts.model
adamw = BERT_BASE.optimizer
# Gluon's Adam (coupled decay, no clipping: the adapter's AdamW is the workload's; here the
# point is the model's loss, not the optimizer).
trainer = gluon.Trainer(model.collect_params(), "adam",
                        {"learning_rate": adamw.lr, "epsilon": adamw.eps})
def step():
    with autograd.record():
        outputs = model(*parts.inputs)
        loss = parts.loss(outputs, parts.targets())
    loss.backward()
    trainer.step(1)
    return outputs, loss
out = {"dtypes": [a.dtype.__name__ for a in parts.inputs]}
# A step of BERT-base takes ~1 s here, eager or hybridized.
for mode, steps in (("eager", 1), ("hybridized", 2)):
    if mode == "hybridized":
        model.hybridize(static_alloc=True, static_shape=True)
    out[mode] = []
    for _ in range(steps):
        outputs, loss = step()
        out[mode].append(float(loss.asscalar()))
out["logits"] = [str(o.dtype) for o in outputs]
print(json.dumps(out))
"""


@pytest.mark.parametrize("precision", ["fp32", "amp"])
def test_the_recipe_trains_eager_and_hybridized(mxnet_python: str, precision: str) -> None:
    """BERT-base from the built-in CPU case's recipe (sequence 32, 5 masked positions, batch
    2): a step eager, then two of the same model and trainer hybridized with static shapes and
    memory, fresh labels every step; in float32, and under bf16 AMP initialized first."""
    refused = precision == "amp" and amp_unavailable("cpu")
    if refused:
        pytest.skip(refused)
    out = run_snippet(mxnet_python, f"precision = {precision!r}\n{TRAIN}")
    assert isinstance(out, dict)
    assert out.pop("dtypes") == ["int32", "int32", "float32", "int32"]
    logits = out.pop("logits")
    # AMP runs the dense layers, the decoder included, in bf16 (MXNet names it by its storage).
    assert all(("bfloat16" in dtype) == (precision == "amp") for dtype in logits), logits
    uniform = math.log(VOCAB) + math.log(2)  # an untrained model's loss over both heads
    assert abs(out["eager"][0] - uniform) < 1.0, out
    for losses in out.values():
        assert all(math.isfinite(loss) for loss in losses), out
        # Later steps wander by several units on fresh labels over 10 masked tokens (torch's
        # model does the same) but do not run away.
        assert max(losses) < 2 * uniform, out
