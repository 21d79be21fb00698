"""MindSpore's BERT trains, in PyNative and compiled in GRAPH mode, in a loop written here.

MindSpore has no BERT that installs beside 2.10, so ``pytest_dlperf.models.bert.mindspore``
writes one. That it is torch's (the same parameters under the same names, the decoder tied,
the same outputs from torch's weights in both modes) is the port contract's, tests/ports.py's
row, checked by tests/test_ports.py. These tests run under MindSpore's interpreter
(``scripts/setup-mindspore``, or ``DLPERF_TEST_MINDSPORE_PYTHON``) and skip without it.
"""

from __future__ import annotations

import math
from pathlib import Path

from snippets import in_a_file, run_snippet

VOCAB = 30522


TRAIN = """
import json
import mindspore as ms
from mindspore import nn
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models import BERT_BASE
from pytest_dlperf.models.bert.mindspore import recipe
ms.set_seed(0)
ctx = BuildContext(framework="mindspore", device_type="cpu", device="cpu",
                   batch_size=BERT_BASE.batch_for("cpu", "fp32"),
                   sizes=BERT_BASE.sizes_for("cpu", "fp32"), precision="fp32",
                   amp_dtype="float32", compiled=True, seed=0, rank=0, world_size=1,
                   local_rank=0)
parts = recipe(ctx)
model = parts.model
adamw = BERT_BASE.optimizer
# MindSpore's AdamWeightDecay: decoupled decay, no bias correction, no clipping (the adapter's
# AdamW is the workload's; here the point is the model's loss, not the optimizer).
opt = nn.AdamWeightDecay(model.trainable_params(), learning_rate=adamw.lr, eps=adamw.eps,
                         weight_decay=adamw.weight_decay)
def forward(input_ids, token_type_ids, attention_mask, positions, mlm, nsp):
    return parts.loss(model(input_ids, token_type_ids, attention_mask, positions), (mlm, nsp))
grad = ms.value_and_grad(forward, None, opt.parameters)
def step(*tensors):  # tensors as arguments: a tuple of new ones recompiles every call
    loss, grads = grad(*tensors)
    opt(grads)
    return loss
losses = {}
# A PyNative step of BERT-base takes ~5 s here, a compiled one ~2 s after ~9 s of compiling.
for mode, run, steps in (("pynative", step, 1), ("graph", ms.jit(step), 2)):
    losses[mode] = [float(run(*parts.inputs, *parts.targets()).asnumpy())
                    for _ in range(steps)]
print(json.dumps({**losses, "training": model.training}))
"""


def test_the_recipe_trains_in_pynative_and_in_graph_mode(mindspore_python: str,
                                                         tmp_path: Path) -> None:
    """BERT-base from the built-in CPU case's recipe (sequence 32, 5 masked positions, batch
    2): a step in PyNative, then two of the same model and optimizer compiled whole with
    ``mindspore.jit``, fresh labels every step."""
    out = run_snippet(mindspore_python, in_a_file(TRAIN, tmp_path))
    assert isinstance(out, dict)
    assert out.pop("training") is True
    uniform = math.log(VOCAB) + math.log(2)  # an untrained model's loss over both heads
    assert abs(out["pynative"][0] - uniform) < 1.0, out
    for losses in out.values():
        assert all(math.isfinite(loss) for loss in losses), out
        # Later steps wander by several units on fresh labels over 10 masked tokens (torch's
        # model does the same) but do not run away.
        assert max(losses) < 2 * uniform, out
