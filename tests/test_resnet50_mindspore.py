"""MindSpore's ResNet-50 trains, in PyNative and in GRAPH mode. That it is torchvision's (the
same parameters under the same names, v1.5 strides, the same logits and BatchNorm statistics
from torchvision's weights) is the port contract's, tests/ports.py's row, checked by
tests/test_ports.py.

``pytest_dlperf.models.resnet50.mindspore`` writes the network from ``mindspore.nn``. These
tests run under MindSpore's interpreter (``scripts/setup-mindspore``, or
``DLPERF_TEST_MINDSPORE_PYTHON``) and skip without it.
"""

from __future__ import annotations

import math
from pathlib import Path

from snippets import in_a_file, run_snippet

TRAIN = """
import json
import mindspore as ms
from mindspore import nn, ops
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models import RESNET50
from pytest_dlperf.models.resnet50.mindspore import recipe
ms.set_seed(0)
batch = RESNET50.batch_for("cpu", "fp32")
ctx = BuildContext(framework="mindspore", device_type="cpu", device="cpu", batch_size=batch,
                   sizes=RESNET50.sizes_for("cpu", "fp32"), precision="fp32",
                   amp_dtype="float32", compiled=True, seed=0, rank=0, world_size=1,
                   local_rank=0)
parts = recipe(ctx)
model = parts.model
sgd = RESNET50.optimizer
opt = nn.Momentum(model.trainable_params(), learning_rate=sgd.lr(batch),
                  momentum=sgd.momentum, weight_decay=sgd.weight_decay)
def forward(images, labels):
    return ops.cross_entropy(model(images), labels)
grad = ms.value_and_grad(forward, None, opt.parameters)
def step(images, labels):  # tensors as arguments: a tuple of new ones recompiles every call
    loss, grads = grad(images, labels)
    opt(grads)
    return loss
losses = {}
# A step takes ~3 s here in either mode (MindSpore's CPU convolutions); compiling ~4 s.
for mode, run, steps in (("pynative", step, 1), ("graph", ms.jit(step), 4)):
    losses[mode] = [float(run(parts.inputs, parts.targets()).asnumpy()) for _ in range(steps)]
print(json.dumps({**losses, "training": model.training}))
"""


def test_the_recipe_trains_with_a_finite_loss_in_pynative_and_in_graph_mode(
        mindspore_python: str, tmp_path: Path) -> None:
    """The built-in CPU case's recipe (64x64, batch 2) over the quick protocol's 5 warm-up
    steps: one in PyNative, then four of the same model and optimizer compiled whole with
    ``mindspore.jit``; SGD with momentum 0.9 and weight decay at the case's learning rate,
    fresh random labels every step. The first loss is an untrained classifier's, ln 1000; out
    of training mode (BatchNorm on its initial moving statistics) mindcv's was 63, and NaN two
    steps later, and this one's 24, then 120. Not the full protocol's 20 steps: one costs ~3 s
    here (25 took 92 s: 6.9 up to 9.2 and finite, as torchvision's 6.5 to 8.9; on one fixed
    batch 6.9 down to 0.001)."""
    out = run_snippet(mindspore_python, in_a_file(TRAIN, tmp_path))
    assert isinstance(out, dict)
    training = out.pop("training")
    assert abs(out["pynative"][0] - math.log(1000)) < 1.0, out
    for losses in out.values():
        assert all(math.isfinite(loss) for loss in losses), out
        # Fresh labels: the loss wanders above ln 1000 but does not run away.
        assert max(losses) < 2 * math.log(1000), out
    assert training is True
