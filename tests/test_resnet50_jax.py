"""JAX's ResNet-50 is torchvision's: the same parameters under the same names, initialized
alike, the same logits and BatchNorm statistics from torchvision's weights (the port contract's,
tests/ports.py, checked in tests/test_ports.py); here, what is this port's own: what it holds,
its modes, the loading's refusals, and the recipe trains; neither JAX nor Flax ships a
ResNet-50, which is why the model is written here.

``pytest_dlperf.models.resnet50.jax`` writes the network as a Flax NNX module; these tests are
what makes its throughput comparable with torch's. They run under JAX's interpreter
(``scripts/setup-jax``, or ``DLPERF_TEST_JAX_PYTHON``) and skip without it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from snippets import run_snippet

OWN = """
import json
import numpy as np
from flax import nnx
from pytest_dlperf.models.resnet50.jax import load_torch_weights, named_parameters, resnet50
model = resnet50()
params = {n: np.asarray(a) for n, a in named_parameters(model).items()}
norms = [m for _, m in nnx.iter_modules(model) if isinstance(m, nnx.BatchNorm)]
modes = [len(norms), sorted({m.use_running_average for m in norms})]
model.eval()
modes.append(sorted({m.use_running_average for m in norms}))
model.train()
modes.append(sorted({m.use_running_average for m in norms}))
weights = params  # torch's names and layout: what the loading checks
other = resnet50(seed=1)
reseeded = bool((other.conv1.kernel[...] != model.conv1.kernel[...]).all())
refused = []
for wrong in ({**weights, "fc.weight": weights["fc.weight"].T},
              {n: a for n, a in weights.items() if n != "bn1.running_var"}):
    try:
        load_torch_weights(other, wrong)
    except ValueError as error:
        refused.append(str(error))
print(json.dumps({"names": list(params), "dtypes": sorted({str(a.dtype) for a in params.values()}),
                  "seeded": bool((resnet50(seed=0).conv1.kernel[...]
                                  == model.conv1.kernel[...]).all()),
                  "reseeded": reseeded, "modes": modes, "refused": refused}))
"""


@pytest.fixture(scope="module")
def own(jax_python: str) -> dict[str, Any]:
    """What this module checks of the port beyond the port contract's (its parameters by
    name and shape, v1.5's strides, torchvision's initialization, torchvision's logits and
    BatchNorm statistics from torchvision's weights: tests/test_ports.py), from one JAX
    process: what the model holds, its modes, and the loading's refusals of its own arrays
    broken two ways."""
    torchvision = pytest.importorskip("torchvision")
    out = run_snippet(jax_python, OWN)
    assert isinstance(out, dict)
    out["torch_names"] = [n for n in torchvision.models.resnet50().state_dict()
                          if not n.endswith("num_batches_tracked")]
    return out


def test_resnet50_holds_torchvisions_state_in_float32_and_switches_its_batch_norms(
        own: dict[str, Any]) -> None:
    """Every running statistic too, under its state_dict name, in its order; float32; a
    function of the seed; built in training mode (BatchNorm on the batch's statistics), and
    eval() and train() switch all 53 BatchNorms."""
    assert own["names"] == own["torch_names"]
    assert own["dtypes"] == ["float32"]
    assert own["seeded"] and own["reseeded"], own  # a function of the seed
    assert own["modes"] == [53, [False], [True], [False]]


def test_the_loading_refuses_what_does_not_fit(own: dict[str, Any]) -> None:
    """A transposed array and a missing running statistic are refused, naming them."""
    wrong_shape, missing = own["refused"]
    assert "fc.weight: torch's array is (2048, 1000)" in wrong_shape, wrong_shape
    assert "parameters without an array: ['bn1.running_var']" in missing, missing


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
