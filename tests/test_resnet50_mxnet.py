"""MXNet's ResNet-50: the recipe trains, and MXNet's own model zoo's is v1, which is why the
model is written here. That it is torchvision's (the same parameters under the same names, v1.5
strides, torchvision's initialization, the same logits, gradients and BatchNorm statistics from
torchvision's weights) is the port contract's, tests/ports.py's row, checked by
tests/test_ports.py.

``pytest_dlperf.models.resnet50.mxnet`` writes the network from ``mxnet.gluon.nn``. These tests
run under MXNet's interpreter (``scripts/setup-mxnet``, or ``DLPERF_TEST_MXNET_PYTHON``) and
skip without it.
"""

from __future__ import annotations

import math

from snippets import run_snippet


def test_mxnets_model_zoo_resnet50_is_v1(mxnet_python: str) -> None:
    """``gluon.model_zoo.vision.resnet50_v1``, what MXNet itself offers, is not DLPerf's
    model: it strides on a stage's first 1x1 convolution, which a parameter count cannot see,
    and its blocks' 1x1 convolutions have biases: 18,880 parameters more."""
    out = run_snippet(mxnet_python, """
import json
import mxnet as mx
model = mx.gluon.model_zoo.vision.resnet50_v1()
model.initialize()
model(mx.nd.zeros((1, 3, 64, 64)))  # the zoo's layers defer their shapes to a first batch
body = model.features[5][0].body  # layer2's first block: conv, bn, relu, conv, bn, relu, conv
print(json.dumps({"parameters": sum(p.data().size for p in model.collect_params().values()
                                    if p.grad_req != "null"),
                  "strides": [list(body[i]._kwargs["stride"]) for i in (0, 3, 6)],
                  "biases": [not body[i]._kwargs["no_bias"] for i in (0, 3, 6)]}))
""")
    assert out == {"parameters": 25_575_912, "strides": [[2, 2], [1, 1], [1, 1]],
                   "biases": [True, False, True]}
    # The biases: a block's first 1x1 has its width, its last 4x its width.
    biases = sum((width + 4 * width) * blocks
                 for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)))
    assert 25_575_912 - 25_557_032 == biases == 18_880


TRAIN = """
import json, math, time
import mxnet as mx
from mxnet import autograd, gluon
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models import RESNET50
from pytest_dlperf.models.resnet50.mxnet import context, recipe
mx.random.seed(0)
batch = RESNET50.batch_for("cpu", "fp32")
ctx = BuildContext(framework="mxnet", device_type="cpu", device="cpu", batch_size=batch,
                   sizes=RESNET50.sizes_for("cpu", "fp32"), precision="fp32",
                   amp_dtype="float32", compiled=True, seed=0, rank=0, world_size=1,
                   local_rank=0)
parts = recipe(ctx)
model = parts.model
sgd = RESNET50.optimizer
trainer = gluon.Trainer(model.collect_params(), "sgd",
                        {"learning_rate": sgd.lr(batch), "momentum": sgd.momentum, "wd": sgd.weight_decay})
cross_entropy = gluon.loss.SoftmaxCrossEntropyLoss()
def step():
    labels = parts.targets()
    with autograd.record():
        loss = cross_entropy(model(parts.inputs), labels).mean()
    loss.backward()
    trainer.step(1)  # the loss is a mean already
    return float(loss.asscalar()), labels
out = {"labels": [], "seconds": {}}
for mode, steps in (("eager", 3), ("hybridized", 5)):
    if mode == "hybridized":
        model.hybridize(static_alloc=True, static_shape=True)
    out[mode] = []
    for _ in range(steps):
        began = time.perf_counter()
        loss, labels = step()
        out["seconds"].setdefault(mode, []).append(round(time.perf_counter() - began, 3))
        out[mode].append(loss)
        out["labels"].append(labels.asnumpy().tolist())
out["images"] = [list(parts.inputs.shape), str(parts.inputs.dtype), str(parts.inputs.context)]
out["label_dtype"] = str(labels.dtype)
out["contexts"] = [str(context(d)) for d in ("cpu", "cuda:0", "cuda:3")]
print(json.dumps(out))
"""


def test_the_recipe_trains_with_a_finite_loss_eager_and_hybridized(mxnet_python: str) -> None:
    """The built-in CPU case's recipe (64x64, batch 2): three steps eager, then five of the
    same model and optimizer hybridized (``static_alloc``, ``static_shape``, as the adapter
    compiles it); SGD with momentum 0.9 and weight decay at the case's learning rate, fresh
    random labels every step. The first loss is an untrained classifier's, ln 1000; with fresh
    labels it wanders above that but does not run away."""
    out = run_snippet(mxnet_python, TRAIN)
    assert isinstance(out, dict)
    assert abs(out["eager"][0] - math.log(1000)) < 1.0, out
    for mode in ("eager", "hybridized"):
        assert all(math.isfinite(loss) for loss in out[mode]), out
        assert max(out[mode]) < 2 * math.log(1000), out
    labels = out["labels"]
    assert len({tuple(step) for step in labels}) == len(labels), labels  # fresh every step
    assert all(0 <= label < 1000 for step in labels for label in step)
    assert out["images"] == [[2, 3, 64, 64], "<class 'numpy.float32'>", "cpu(0)"]
    assert out["label_dtype"] == "<class 'numpy.int32'>"
    assert out["contexts"] == ["cpu(0)", "gpu(0)", "gpu(3)"]
