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


def wide_deep_oneflow(spec: dict[str, Any]) -> dict[str, Any]:
    """Built at a CPU case's sizes: its parameters by name and shape, initialized as torch's
    (tables uniform in (-0.05, 0.05), the tower Xavier-uniform, zero biases); its ids from
    torch's uniforms. Then SMALL from torch's weights, in eval mode (no dropout on either
    side), on torch's batch of 64."""
    import oneflow as flow

    from pytest_dlperf.models.wide_deep import WideDeepShape
    from pytest_dlperf.models.wide_deep.oneflow import build, ids_of

    model = build(WideDeepShape.of(sizes(False)))
    fresh = {n: p.numpy().copy() for n, p in model.named_parameters()}
    tables = np.concatenate([fresh["wide_embedding.weight"].ravel(),
                             fresh["deep_embedding.weight"].ravel()])
    first = fresh["tower.0.weight"]
    ref = np.load(spec["reference"])
    shape = WideDeepShape.of(sizes(True))
    ids = {name: ids_of(shape, flow.tensor(ref["u/" + name]), first_slot).numpy()
           for name, first_slot in (("wide", shape.deep_slots), ("deep", 0))}
    out: dict[str, Any] = {"shapes": {n: list(a.shape) for n, a in fresh.items()}, "probes": {
        "ids_differ": {k: int((ids[k] != ref[k]).sum()) for k in ids},
        "table_range": [float(tables.min()), float(tables.max())],
        "table_std": float(tables.std()),
        "first_bound": float(np.abs(first).max()) / float(np.sqrt(6 / sum(first.shape))),
        "biases": max(float(np.abs(v).max()) for n, v in fresh.items() if n.endswith("bias"))}}
    del model, fresh, tables
    model = build(shape).eval()
    model.load_state_dict({n: flow.tensor(ref["param/" + n]) for n, _ in model.named_parameters()})
    with flow.no_grad():
        logits = model(*(flow.tensor(ref[k]) for k in ("dense", "wide", "deep")))
        loss = flow.nn.functional.binary_cross_entropy_with_logits(logits,
                                                                   flow.tensor(ref["clicks"]))
    out["outputs"] = {"eager": {"logits": float(np.abs(logits.numpy() - ref["logits"]).max()),
                                "loss": float(abs(loss.numpy() - ref["loss"]))}}
    out["once"] = {}
    return out
