"""JAX's ResNet-50 is torchvision's: the same parameters under the same names, initialized
alike, the same logits and BatchNorm statistics from torchvision's weights, and the recipe
trains; neither JAX nor Flax ships a ResNet-50, which is why the model is written here.

``pytest_dlperf.models.resnet50.jax`` writes the network as a Flax NNX module; these tests are
what makes its throughput comparable with torch's. They run under JAX's interpreter
(``scripts/setup-jax``, or ``DLPERF_TEST_JAX_PYTHON``) and skip without it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from snippets import run_snippet


def test_resnet50_is_torchvisions_layer_for_layer(jax_python: str) -> None:
    torchvision = pytest.importorskip("torchvision")
    out = run_snippet(jax_python, """
import json, math
import jax
from flax import nnx
from pytest_dlperf.models.resnet50.jax import named_parameters, resnet50, torch_named_shapes
model = resnet50()
block = model.layer2[0]
params = {n: jax.device_get(a) for n, a in named_parameters(model).items()}
convs = [a.std() / math.sqrt(2 / (a.shape[0] * a.shape[2] * a.shape[3]))
         for n, a in params.items() if a.ndim == 4]
norms = [m for _, m in nnx.iter_modules(model) if isinstance(m, nnx.BatchNorm)]
modes = [len(norms), sorted({m.use_running_average for m in norms})]
model.eval()
modes.append(sorted({m.use_running_average for m in norms}))
model.train()
modes.append(sorted({m.use_running_average for m in norms}))
print(json.dumps({"shapes": torch_named_shapes(model), "names": list(params),
                  "strides": [list(conv.strides) for conv in (block.conv1, block.conv2,
                                                               block.conv3)],
                  "dtypes": sorted({str(a.dtype) for a in params.values()}),
                  "conv_std_over_he": [float(min(convs)), float(max(convs))],
                  "fc_over_bound": [float(abs(params[n]).max() * math.sqrt(2048))
                                    for n in ("fc.weight", "fc.bias")],
                  "norms": sorted({float(v) for n, a in params.items() if a.ndim == 1
                                   and not n.startswith("fc.") for v in set(a.tolist())}),
                  "seeded": bool((resnet50(seed=0).conv1.kernel[...]
                                  == model.conv1.kernel[...]).all()),
                  "reseeded": bool((resnet50(seed=1).conv1.kernel[...]
                                    != model.conv1.kernel[...]).all()),
                  "modes": modes}))
""")
    assert isinstance(out, dict)
    shapes = {name: tuple(shape) for name, shape in out["shapes"].items()}
    reference = torchvision.models.resnet50()
    torch_shapes = {n: tuple(p.shape) for n, p in reference.named_parameters()}
    assert list(shapes) == list(torch_shapes)  # the same 161 names, in torch's order
    assert {n: (s, torch_shapes[n]) for n, s in shapes.items() if torch_shapes[n] != s} == {}
    assert sum(math.prod(shape) for shape in shapes.values()) == 25_557_032
    # ... and every running statistic too, under its state_dict name, in its order.
    assert out["names"] == [n for n in reference.state_dict()
                            if not n.endswith("num_batches_tracked")]
    # v1.5: a stage's first block strides on its 3x3 conv, not on its first 1x1.
    assert out["strides"] == [[1, 1], [2, 2], [1, 1]]
    assert out["dtypes"] == ["float32"]
    # torchvision's initialization: He-normal over fan-out (the smallest conv has 4,096
    # weights), torch Linear's uniform bound, BatchNorm's 1 and 0.
    low, high = out["conv_std_over_he"]  # measured 0.991-1.009; over fan-in: 0.50-4.6
    assert 0.95 < low <= high < 1.05, out["conv_std_over_he"]
    assert all(0.99 < ratio <= 1 for ratio in out["fc_over_bound"]), out["fc_over_bound"]
    assert out["norms"] == [0.0, 1.0]  # scale and running var 1, bias and running mean 0
    assert out["seeded"] and out["reseeded"], out  # a function of the seed
    # Built in training mode (BatchNorm on the batch's statistics); eval() and train() switch
    # all 53 BatchNorms.
    assert out["modes"] == [53, [False], [True], [False]]


def torch_reference(path: Path) -> None:
    """torchvision's ResNet-50 from a seed, with running statistics that are not BatchNorm's
    initial 0 and 1, its weights, two 64x64 images (NHWC, JAX's layout) and what it makes of
    them (``path``, an .npz): eval logits; training-mode logits and the running statistics
    after, as torch moves them and as Flax would (with the batch's biased variance)."""
    import numpy as np
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    norms: dict[str, Any] = {n: m for n, m in model.named_modules()
                             if isinstance(m, torch.nn.BatchNorm2d)}
    with torch.no_grad():
        for module in norms.values():
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
        images = torch.randn(2, 3, 64, 64)
        arrays = {name: value.numpy().copy() for name, value in model.state_dict().items()
                  if not name.endswith("num_batches_tracked")}
        logits = model(images)
        biased = {}
        for name, module in norms.items():  # what Flax's rule makes of each BatchNorm's input
            def expect(module: Any, args: tuple[Any, ...], name: str = name) -> None:
                var = args[0].var(dim=(0, 2, 3), unbiased=False)
                biased[f"{name}.running_var"] = (0.9 * module.running_var + 0.1 * var).numpy()
            module.register_forward_pre_hook(expect)
        train_logits = model.train()(images)
    np.savez(path, images=images.permute(0, 2, 3, 1).numpy(), logits=logits.numpy(),
             train_logits=train_logits.numpy(), **{f"param/{n}": a for n, a in arrays.items()},
             **{f"after/{n}": a.numpy() for n, a in model.state_dict().items()
                if n.endswith(("running_mean", "running_var"))},
             **{f"biased/{n}": a for n, a in biased.items()})


COMPARE = """
import json
import jax
import numpy as np
from flax import nnx
from pytest_dlperf.models.resnet50.jax import load_torch_weights, named_parameters, resnet50
ref = np.load(REF)
weights = {k[len("param/"):]: ref[k] for k in ref.files if k.startswith("param/")}
def worst(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())
model = resnet50(seed=1)
try:
    load_torch_weights(model, {**weights, "fc.weight": weights["fc.weight"].T})
except ValueError as error:
    refused = [str(error)]
try:
    load_torch_weights(model, {n: a for n, a in weights.items() if n != "bn1.running_var"})
except ValueError as error:
    refused.append(str(error))
load_torch_weights(model, weights)
forward = nnx.jit(lambda model, images: model(images))
model.eval()  # BatchNorm on its running statistics
logits = np.asarray(forward(model, ref["images"]))
model.train()  # on the batch's statistics, moving the running ones
train_logits = np.asarray(forward(model, ref["images"]))
stats = {n: np.asarray(a) for n, a in named_parameters(model).items()
         if n.endswith(("running_mean", "running_var"))}
print(json.dumps({
    "scale": float(np.abs(ref["logits"]).max()), "refused": refused,
    "eval": worst(logits, ref["logits"]), "train": worst(train_logits, ref["train_logits"]),
    "means": max(worst(a, ref["after/" + n]) for n, a in stats.items() if n.endswith("mean")),
    "variances": max(worst(a, ref["biased/" + n]) for n, a in stats.items()
                     if n.endswith("var")),
    "variances_vs_torch": max(worst(a, ref["after/" + n]) for n, a in stats.items()
                              if n.endswith("var"))}))
"""


def test_torchvisions_weights_give_torchvisions_logits_and_statistics(
        jax_python: str, tmp_path: Path) -> None:
    """Eval mode (BatchNorm on its running statistics, loaded too), then one forward in
    training mode (on the batch's statistics, which moves the running ones), on two 64x64
    images, each compiled with ``nnx.jit``. Errors are relative to the largest value of each
    array; the loader's refusals are checked on the way.

    Measured with JAX 0.12.0.1 and Flax 0.12.12 on CPU: eval logits within 7.5e-7 (of logits
    up to 130), training-mode logits 8.5e-5, running means 4.8e-5, running variances 8.7e-5 of
    Flax's rule (and, not asserted here, the gradients of a cross-entropy 2.0e-2 of torch's as
    one vector: a training-mode BatchNorm over 8 values a channel is ill-conditioned, MXNet's
    are 2.5e-2). Epsilon 2e-5 instead of 1e-5 moves the eval logits by 1.6e-4; momentum 0.89
    (torch's 0.11) the running means by 0.11, 0.1 (torch's 0.1 passed as it is) by 9.0; the
    max pool unpadded the eval logits by 6.5e-2, Flax's ``"SAME"`` padding by 0.20, the stride
    on the 1x1 by 0.20, a kernel loaded by reshaping instead of transposing by 1.3.

    Flax moves the running variance with the batch's biased variance, torch with the unbiased
    one: checked against Flax's rule applied to what torch's BatchNorms saw (the running means
    against torch's own), and shown apart from torch's (in layer4, 8 values a channel: 0.1 x
    1/7 of the batch's variance). What a training step normalizes with is the batch's biased
    variance in both.
    """
    pytest.importorskip("torchvision")
    torch_reference(tmp_path / "ref.npz")
    out = run_snippet(jax_python, COMPARE.replace("REF", repr(str(tmp_path / "ref.npz"))))
    assert isinstance(out, dict)
    assert out["scale"] > 0.1, out  # logits worth comparing
    wrong_shape, missing = out["refused"]
    assert "fc.weight: torch's array is (2048, 1000)" in wrong_shape, wrong_shape
    assert "parameters without an array: ['bn1.running_var']" in missing, missing
    assert out["eval"] < 1e-5, out  # relative to the largest logit
    assert out["train"] < 5e-4, out
    assert out["means"] < 5e-4, out
    assert out["variances"] < 5e-4, out
    assert out["variances_vs_torch"] > 1e-2, out  # Flax's rule is not torch's


RECIPE = """
import json
import jax, jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from pytest_dlperf.core.workload import BuildContext
from pytest_dlperf.models import RESNET50
from pytest_dlperf.models.resnet50.jax import recipe
batch = RESNET50.batch_for("cpu", PRECISION)
parts = recipe(BuildContext(framework="jax", device_type="cpu", device="cpu", batch_size=batch,
                            sizes=RESNET50.sizes_for("cpu", PRECISION), precision=PRECISION,
                            amp_dtype=DTYPE, compiled=True, seed=0, rank=0, world_size=1,
                            local_rank=0))
def dtypes(model):
    return sorted({str(a.dtype) for a in jax.tree.leaves(nnx.state(model))})
out = {"images": [list(parts.inputs.shape), str(parts.inputs.dtype)]}
"""

TRAIN = RECIPE + """
sgd = RESNET50.optimizer
tx = optax.chain(optax.add_decayed_weights(sgd.weight_decay),  # coupled L2, as torch's
                 optax.sgd(sgd.lr(batch), momentum=sgd.momentum))
graphdef, params, stats = nnx.split(parts.model, nnx.Param, nnx.BatchStat)  # all it holds
def loss_fn(params, stats, images, labels):
    model = nnx.merge(graphdef, params, stats, copy=True)  # new variables, in this trace
    logits = model(images)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                           labels).mean()
    return loss, (nnx.state(model, nnx.BatchStat), logits)  # the statistics it moved
@jax.jit
def step(params, stats, opt_state, images, labels):
    (loss, (stats, logits)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, stats, images, labels)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), stats, opt_state, loss, logits
opt_state = tx.init(params)
out.update(losses=[], labels=[])
for _ in range(3):
    labels = parts.targets()
    params, stats, opt_state, loss, logits = step(params, stats, opt_state, parts.inputs,
                                                  labels)
    out["losses"].append(float(loss))
    out["labels"].append(np.asarray(labels).tolist())
nnx.update(parts.model, params, stats)
out.update(moved=float(jnp.abs(parts.model.bn1.mean[...]).max()), dtypes=dtypes(parts.model),
           logits=str(logits.dtype), label_dtype=str(labels.dtype))
print(json.dumps(out))
"""


def test_the_recipe_trains_with_a_finite_loss(jax_python: str) -> None:
    """The built-in CPU case's recipe (64x64, batch 2): three steps of SGD with momentum 0.9
    and coupled weight decay at the case's learning rate, ``jax.value_and_grad`` over
    ``nnx.split`` / ``nnx.merge`` in one ``jax.jit``, fresh random labels every step, the
    running statistics handed back out of the step. The first loss is an untrained
    classifier's, ln 1000; with fresh labels it wanders above that but does not run away.

    Not at 32x32: layer4's maps are 1x1 there, BatchNorm over a batch of 2 normalizes two
    values to +-1, and the gradients are degenerate in torch as here (torchvision's norm
    3.6e8 on its first step, 3.4e3 at 64x64); four steps took bn1's scale to 2.7e4 while the
    loss, renormalized, stayed near ln 1000, which would hide a broken model."""
    code = TRAIN.replace("PRECISION", repr("fp32")).replace("DTYPE", repr("float32"))
    out = run_snippet(jax_python, code)
    assert isinstance(out, dict)
    losses = out["losses"]
    assert abs(losses[0] - math.log(1000)) < 1.0, out
    assert all(math.isfinite(loss) for loss in losses), out
    assert max(losses) < 2 * math.log(1000), out
    assert 0 < out["moved"] < 1, out  # the steps moved BatchNorm's running statistics
    labels = out["labels"]
    assert len({tuple(step) for step in labels}) == len(labels), labels  # fresh every step
    assert all(0 <= label < 1000 for step in labels for label in step)
    assert out["images"] == [[2, 64, 64, 3], "float32"]
    assert out["label_dtype"] == "int32"
    assert out["logits"] == "float32"
    assert out["dtypes"] == ["float32"]


AMP = RECIPE + """
logits = nnx.jit(lambda model, images: model(images))(parts.model, parts.inputs)
out.update(logits=str(logits.dtype), finite=bool(jnp.isfinite(logits).all()),
           moved=float(jnp.abs(parts.model.bn1.mean[...]).max()), dtypes=dtypes(parts.model))
print(json.dumps(out))
"""


def test_under_amp_the_recipe_computes_in_bfloat16_on_float32_parameters(
        jax_python: str) -> None:
    """The recipe under CPU AMP's dtype, one forward in training mode: the logits come out in
    bfloat16 (the adapter casts them for the loss), finite; the parameters and the running
    statistics it moved stay float32."""
    code = AMP.replace("PRECISION", repr("amp")).replace("DTYPE", repr("bfloat16"))
    out = run_snippet(jax_python, code)
    assert isinstance(out, dict)
    assert out["images"] == [[2, 64, 64, 3], "float32"], out
    assert out["logits"] == "bfloat16", out
    assert out["finite"] is True, out
    assert out["moved"] > 0, out
    assert out["dtypes"] == ["float32"], out
