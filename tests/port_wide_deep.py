"""The port job's Wide & Deep ports (tests/port_job.py): built as a CPU case builds it (vocab
200k: its parameters by torch's names and shapes, as many trainable), then SMALL from torch's
weights (tests/port_references.py's reference), each under its framework's interpreter: no
pytest, the framework imported inside its function only.

Each framework runs in a process of its own: TensorFlow's and Paddle's Wide & Deep in one
process crash it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# float32 on both sides, measured 3.7e-8 (TensorFlow) and 6.0e-8 (Paddle) apart (logits up
# to 0.22; the loss, 0.69, 6.0e-8). A tower without its ReLUs moves the logits by 3.0e-1,
# the wide logit left out by 8.8e-2.


def sizes(small: bool) -> dict[str, Any]:
    """A CPU case's sizes; SMALL's (small enough to build in a moment, with every part of
    the model: 2 hidden layers) where ``small``."""
    from pytest_dlperf.models import wide_deep

    cpu = wide_deep.WORKLOAD.sizes_for("cpu", "fp32")  # vocab 200k, as a CPU case builds it
    return {**cpu, "vocab": 5_000, "hidden_size": 64} if small else cpu


def wide_deep_tensorflow(spec: dict[str, Any]) -> dict[str, Any]:
    """Built from the recipe at a CPU case's sizes; then SMALL from torch's weights, in
    inference (no dropout on either side), on torch's batch of 64."""
    from pytest_dlperf.core.workload import BuildContext
    from pytest_dlperf.models.wide_deep import WideDeepShape
    from pytest_dlperf.models.wide_deep import tensorflow as ours

    context = BuildContext("tensorflow", "cpu", "cpu", 8, sizes(False), "fp32", "float32",
                           False, 0, 0, 1, 0)
    model = ours.recipe(context).model
    out: dict[str, Any] = {"shapes": ours.torch_named_shapes(model), "probes": {
        "trainable": sum(int(np.prod(w.shape)) for w in model.trainable_weights)}}
    del model
    ref = np.load(spec["reference"])
    model = ours.build(WideDeepShape.of(sizes(True)))
    ours.load_torch_weights(model, {k.removeprefix("param/"): ref[k] for k in ref.files
                                    if k.startswith("param/")})
    logits = model((ref["dense"], ref["wide"], ref["deep"]), training=False)
    loss = ours.click_loss(logits, ref["clicks"])
    out["outputs"] = {"eager": {"logits": float(np.abs(logits.numpy() - ref["logits"]).max()),
                                "loss": float(abs(float(loss) - float(ref["loss"])))}}
    out["once"] = {}
    return out


def wide_deep_paddle(spec: dict[str, Any]) -> dict[str, Any]:
    """Built from the recipe at a CPU case's sizes; then SMALL from torch's weights, in eval
    mode (no dropout on either side), on torch's batch of 64."""
    import math

    import paddle

    from pytest_dlperf.core.workload import BuildContext
    from pytest_dlperf.models.wide_deep import WideDeepShape
    from pytest_dlperf.models.wide_deep import paddle as ours

    context = BuildContext("paddle", "cpu", "cpu", 8, sizes(False), "fp32", "float32", False,
                           0, 0, 1, 0)
    model = ours.recipe(context).model
    out: dict[str, Any] = {"shapes": ours.torch_named_shapes(model), "probes": {
        "trainable": sum(math.prod(p.shape) for p in model.parameters()
                         if not p.stop_gradient)}}
    del model
    ref = np.load(spec["reference"])
    model = ours.build(WideDeepShape.of(sizes(True)))
    model.eval()
    ours.load_torch_weights(model, {k.removeprefix("param/"): ref[k] for k in ref.files
                                    if k.startswith("param/")})
    with paddle.no_grad():
        logits = model(*(paddle.to_tensor(ref[k]) for k in ("dense", "wide", "deep")))
        loss = ours.click_loss(logits, paddle.to_tensor(ref["clicks"]))
    out["outputs"] = {"eager": {"logits": float(np.abs(logits.numpy() - ref["logits"]).max()),
                                "loss": float(abs(float(loss) - float(ref["loss"])))}}
    out["once"] = {}
    return out
