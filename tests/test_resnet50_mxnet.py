"""MXNet's ResNet-50 is torchvision's: the same parameters under the same names, the same
logits and BatchNorm statistics from torchvision's weights, and the recipe trains; MXNet's own
model zoo's is v1, which is why the model is written here.

``pytest_dlperf.models.resnet50.mxnet`` writes the network from ``mxnet.gluon.nn``; these tests
are what makes its throughput comparable with torch's. They run under MXNet's interpreter
(``scripts/setup-mxnet``, or ``DLPERF_TEST_MXNET_PYTHON``) and skip without it.
"""

from __future__ import annotations

import math

import pytest
from port_references import torch_reference, torch_shapes
from snippets import run_snippet


def test_resnet50_is_torchvisions_layer_for_layer(mxnet_python: str) -> None:
    pytest.importorskip("torchvision")
    out = run_snippet(mxnet_python, """
import json, math
from pytest_dlperf.models.resnet50.mxnet import named_parameters, resnet50, torch_named_shapes
model = resnet50()
block = model.layer2[0]
params = {n: p.data().asnumpy() for n, p in named_parameters(model).items()}
convs = [a.std() / math.sqrt(2 / (a.shape[0] * a.shape[2] * a.shape[3]))
         for n, a in params.items() if a.ndim == 4]
print(json.dumps({"shapes": torch_named_shapes(model),
                  "strides": [list(conv._kwargs["stride"])
                              for conv in (block.conv1, block.conv2, block.conv3)],
                  "deferred": [n for n, p in model.collect_params().items()
                               if p._deferred_init],
                  "conv_std_over_he": [float(min(convs)), float(max(convs))],
                  "fc_over_bound": [float(abs(params[n]).max() * math.sqrt(2048))
                                    for n in ("fc.weight", "fc.bias")],
                  "norms": sorted({float(v) for n, a in params.items() if a.ndim == 1
                                   and not n.startswith("fc.") for v in set(a.tolist())})}))
""")
    assert isinstance(out, dict)
    shapes = {name: tuple(shape) for name, shape in out["shapes"].items()}
    torchs = torch_shapes("resnet50")
    assert list(shapes) == list(torchs)  # the same 161 names, in torch's order
    assert {n: (s, torchs[n]) for n, s in shapes.items() if torchs[n] != s} == {}
    assert sum(math.prod(shape) for shape in shapes.values()) == 25_557_032
    # v1.5: a stage's first block strides on its 3x3 conv, not on its first 1x1.
    assert out["strides"] == [[1, 1], [2, 2], [1, 1]]
    assert out["deferred"] == []  # every parameter made at construction, none waits for data
    # torchvision's initialization: He-normal over fan-out (measured 0.993-1.019 of its std;
    # the smallest conv has 4,096 weights), torch Linear's uniform bound, BatchNorm's 1 and 0.
    low, high = out["conv_std_over_he"]
    assert 0.95 < low <= high < 1.05, out["conv_std_over_he"]
    assert all(0.99 < ratio <= 1 for ratio in out["fc_over_bound"]), out["fc_over_bound"]
    assert out["norms"] == [0.0, 1.0]  # gamma and running var 1, beta and running mean 0


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


COMPARE = """
import json
import numpy as np
import mxnet as mx
from mxnet import autograd
from pytest_dlperf.models.resnet50.mxnet import load_torch_weights, named_parameters, resnet50
ref = np.load(REF)
weights = {k[len("param/"):]: ref[k] for k in ref.files if k.startswith("param/")}
images, head = mx.nd.array(ref["images"]), mx.nd.array(ref["head"])
def worst(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())
out = {"scale": float(np.abs(ref["logits"]).max())}
for mode in ("eager", "hybridized"):
    model = resnet50()
    load_torch_weights(model, weights)
    if mode == "hybridized":
        model.hybridize(static_alloc=True, static_shape=True)
    params = named_parameters(model)
    logits = model(images).asnumpy()  # not recording: BatchNorm on its running statistics
    with autograd.record():  # training mode: BatchNorm on the batch's statistics
        train_logits = model(images)
    train_logits.backward(head)  # MXNet moves the running statistics here, in the backward
    # ... and, hybridized with static_shape, without telling its engine: wait for all.
    mx.nd.waitall()
    stats = {n: p.data().asnumpy() for n, p in params.items()
             if n.endswith(("running_mean", "running_var"))}
    grads = {n: p.grad().asnumpy() for n, p in params.items() if p.grad_req != "null"}
    apart = sum(float(np.square(g - ref["grad/" + n]).sum()) for n, g in grads.items())
    norm = sum(float(np.square(ref["grad/" + n]).sum()) for n in grads)
    out[mode] = {
        "eval": worst(logits, ref["logits"]),
        "gradients": (apart / norm) ** 0.5,  # of all, as one vector
        "train": worst(train_logits.asnumpy(), ref["train_logits"]),
        "means": max(worst(a, ref["after/" + n]) for n, a in stats.items()
                     if n.endswith("mean")),
        "variances": max(worst(a, ref["biased/" + n]) for n, a in stats.items()
                         if n.endswith("var")),
        "variances_vs_torch": max(worst(a, ref["after/" + n]) for n, a in stats.items()
                                  if n.endswith("var"))}
print(json.dumps(out))
"""


def test_torchvisions_weights_give_torchvisions_logits_gradients_and_statistics(
        mxnet_python: str) -> None:
    """Eval mode (BatchNorm on its running statistics, loaded too), then one forward in
    training mode (under ``autograd.record``: on the batch's statistics) and its backward, on
    two 64x64 images, eager and hybridized. Errors are relative to the largest value of each
    array; the gradients' is of all of them as one vector.

    Measured with MXNet 1.9.1 on CPU, eager and hybridized alike: eval logits within 8.3e-7
    (of logits up to 130), training-mode logits 7.1e-5, running means 4.3e-5, running
    variances 7.2e-5 of MXNet's rule, gradients 2.5e-2. The gradients of a training-mode
    BatchNorm over 8 values a channel (layer4) are ill-conditioned: torch's own float32 is
    7.3e-3 from its float64, MXNet's 2.3e-2 (1.9e-2 with oneDNN off), at 160x160 1.9e-2 and
    2.9e-2; the stride of layer2's first block on its 1x1 puts them 1.4 apart. Epsilon 2e-5
    instead of 1e-5 moves the eval logits by 1.6e-4 (1e-3: 1.6e-2), the training-mode logits
    by 9.1e-4 and the statistics by 6.4e-4; momentum 0.89 (torch's 0.11) the running means by
    0.11, 0.1 (torch's 0.1 passed as it is) by 9.0; the max pool unpadded the eval logits by
    6.5e-2; the stride on the 1x1 by 0.20.

    MXNet moves BatchNorm's running statistics in the backward pass, not in the forward, and
    its running variance with the batch's biased variance where torch's takes the unbiased
    one: in layer4 (2x2 maps, batch 2: 8 values a channel), 0.1 x 1/7 of the batch's variance
    apart, 9.6e-2 of the largest. The statistics of a training step's BatchNorm are the
    batch's in both, so what is trained, and timed, is the same; only the running variance
    that an eval would use differs. Hybridized with ``static_shape``, the backward updates them
    without the engine knowing: ``data().asnumpy()`` read right after it showed the initial
    statistics until ``mx.nd.waitall()``.
    """
    pytest.importorskip("torchvision")
    reference = torch_reference("resnet50")
    out = run_snippet(mxnet_python, COMPARE.replace("REF", repr(str(reference))))
    assert isinstance(out, dict)
    assert out["scale"] > 0.1, out  # logits worth comparing
    for mode in ("eager", "hybridized"):
        assert out[mode]["eval"] < 1e-5, out  # relative to the largest logit
        assert out[mode]["train"] < 5e-4, out
        assert out[mode]["gradients"] < 0.1, out
        assert out[mode]["means"] < 5e-4, out
        assert out[mode]["variances"] < 5e-4, out
        assert out[mode]["variances_vs_torch"] > 1e-2, out  # MXNet's rule is not torch's


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
