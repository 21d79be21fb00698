"""The port job's ResNet-50 ports (tests/port_job.py): built only (names, shapes, v1.5 strides,
initialization), then torchvision's weights (tests/port_references.py's reference), each under
its framework's interpreter: Python 3.10 syntax, no pytest, the framework imported inside its
function only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def worst(got: Any, want: Any) -> float:
    """The largest difference, relative to the largest value wanted."""
    return float(np.abs(got - want).max() / np.abs(want).max())


def init_probes(params: dict[str, Any]) -> dict[str, Any]:
    """How the parameters (NumPy arrays, torch's names and layout) were initialized, as
    torchvision initializes them: each conv's std over He's, the head's largest value over
    Linear's bound, the values BatchNorm's weights and biases start at."""
    convs = [a.std() / math.sqrt(2 / (a.shape[0] * a.shape[2] * a.shape[3]))
             for a in params.values() if a.ndim == 4]
    return {"conv_std_over_he": [float(min(convs)), float(max(convs))],
            "fc_over_bound": [float(abs(params[n]).max() * math.sqrt(2048))
                              for n in ("fc.weight", "fc.bias")],
            "norms": sorted({float(v) for n, a in params.items() if a.ndim == 1
                             and not n.startswith("fc.") for v in set(a.tolist())})}


def resnet50_mxnet(spec: dict[str, Any]) -> dict[str, Any]:
    """Built only: names, shapes, strides, initialization. Then, from torchvision's weights:
    Eval mode (BatchNorm on its running statistics, loaded too), then one forward in
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
    import mxnet as mx
    from mxnet import autograd

    from pytest_dlperf.models.resnet50.mxnet import (
        load_torch_weights,
        named_parameters,
        resnet50,
        torch_named_shapes,
    )

    model = resnet50()
    block = model.layer2[0]
    params = {n: p.data().asnumpy() for n, p in named_parameters(model).items()}
    out: dict[str, Any] = {"shapes": torch_named_shapes(model), "probes": {
        "strides": [list(conv._kwargs["stride"]) for conv in (block.conv1, block.conv2,
                                                              block.conv3)],
        "deferred": [n for n, p in model.collect_params().items() if p._deferred_init],
        **init_probes(params)}}

    ref = np.load(spec["reference"])
    weights = {k[len("param/"):]: ref[k] for k in ref.files if k.startswith("param/")}
    images, head = mx.nd.array(ref["images"]), mx.nd.array(ref["head"])
    outputs: dict[str, Any] = {}
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
        outputs[mode] = {
            "eval": worst(logits, ref["logits"]),
            "gradients": (apart / norm) ** 0.5,  # of all, as one vector
            "train": worst(train_logits.asnumpy(), ref["train_logits"]),
            "means": max(worst(a, ref["after/" + n]) for n, a in stats.items()
                         if n.endswith("mean")),
            "variances": max(worst(a, ref["biased/" + n]) for n, a in stats.items()
                             if n.endswith("var")),
            "variances_vs_torch": max(worst(a, ref["after/" + n]) for n, a in stats.items()
                                      if n.endswith("var"))}
    out["outputs"] = outputs
    out["once"] = {"scale": float(np.abs(ref["logits"]).max())}
    return out


def resnet50_mindspore(spec: dict[str, Any]) -> dict[str, Any]:
    """Built only: names, shapes, strides, the training flag. Then, from torchvision's
    weights: Eval mode (BatchNorm on its running statistics, loaded too), then one forward in
    training mode (on the batch's statistics, which also moves the running ones), on two 64x64
    images: the same function in both modes, and the same BatchNorm. Errors are relative to the
    largest value of each. Measured with MindSpore 2.10.0 on CPU (2026-11-26): a faithful model
    is within 8.5e-7 in eval mode (1.1e-4 of logits up to 130), 1.1e-4 in training mode and
    1.0e-4 in the statistics (torch's own float32 is as far from its float64: 1.5e-4 and
    2.4e-4 absolute, batch statistics of 8 values a channel in layer4). BatchNorm epsilon 2e-5
    instead of 1e-5 moves them by 1.6e-4, 9.1e-4 and 8.5e-4; momentum 0.89 in MindSpore's
    convention (torch's 0.11) the statistics by 8.4e-2; 0.1 (torch's 0.1 passed as it is) by
    9.0; epsilon 1e-3 the eval logits by 1.6e-2; ``pad_mode="same"`` by 0.20."""
    import mindspore as ms

    from pytest_dlperf.models.resnet50.mindspore import (
        load_torch_weights,
        resnet50,
        torch_name,
        torch_named_shapes,
    )

    model = resnet50()
    block = model.layer2[0]
    out: dict[str, Any] = {"shapes": torch_named_shapes(model), "probes": {
        # Out of training, BatchNorm normalizes nothing (the NaN).
        "training": model.training,
        "strides": [list(block.conv1.stride), list(block.conv2.stride),
                    list(block.conv3.stride)]}}

    ref = np.load(spec["reference"])
    model = resnet50()
    load_torch_weights(model, {k[len("param/"):]: ref[k] for k in ref.files
                               if k.startswith("param/")})
    images = ms.Tensor(ref["images"])
    model.set_train(False)
    logits = model(images).asnumpy()
    model.set_train(True)
    train_logits = model(images).asnumpy()
    stats = {torch_name(n): p.asnumpy() for n, p in model.parameters_and_names()
             if n.endswith(("moving_mean", "moving_variance"))}
    out["outputs"] = {"pynative": {
        "eval": worst(logits, ref["logits"]), "train": worst(train_logits, ref["train_logits"]),
        "statistics": max(worst(a, ref["after/" + n]) for n, a in stats.items())}}
    out["once"] = {"scale": float(np.abs(ref["logits"]).max())}
    return out


def resnet50_jax(spec: dict[str, Any]) -> dict[str, Any]:
    """Built only: names, shapes, strides, initialization. Then, from torchvision's weights:
    Eval mode (BatchNorm on its running statistics, loaded too), then one forward in training
    mode (on the batch's statistics, which moves the running ones), on two 64x64 images (NHWC,
    JAX's layout), each compiled with ``nnx.jit``. Errors are relative to the largest value of
    each array.

    Measured with JAX 0.12.0.1 and Flax 0.12.12 on CPU: eval logits within 7.5e-7 (of logits
    up to 130), training-mode logits 8.5e-5, running means 4.8e-5, running variances 8.7e-5 of
    Flax's rule (and, not asserted here, the gradients of a cross-entropy 2.0e-2 of torch's as
    one vector: a training-mode BatchNorm over 8 values a channel is ill-conditioned, MXNet's
    are 2.5e-2). Epsilon 2e-5 instead of 1e-5 moves the eval logits by 1.6e-4; momentum 0.89
    (torch's 0.11) the running means by 0.11, 0.1 (torch's 0.1 passed as it is) by 9.0; the
    max pool unpadded the eval logits by 6.5e-2, Flax's ``"SAME"`` padding by 0.20, the stride
    on the 1x1 by 0.20, a kernel loaded by reshaping instead of transposing by 1.3.

    Flax moves the running variance with the batch's biased variance, torch with the unbiased
    one, as MXNet: checked against that rule applied to what torch's BatchNorms saw (the
    running means against torch's own), and shown apart from torch's (in layer4, 8 values a
    channel: 0.1 x 1/7 of the batch's variance). What a training step normalizes with is the
    batch's biased variance in both."""
    from flax import nnx

    from pytest_dlperf.models.resnet50.jax import (
        load_torch_weights,
        named_parameters,
        resnet50,
        torch_named_shapes,
    )

    model = resnet50()
    block = model.layer2[0]
    params = {n: np.asarray(a) for n, a in named_parameters(model).items()}
    out: dict[str, Any] = {"shapes": torch_named_shapes(model), "probes": {
        "strides": [list(conv.strides) for conv in (block.conv1, block.conv2, block.conv3)],
        **init_probes(params)}}
    del model, params

    ref = np.load(spec["reference"])
    model = resnet50(seed=1)
    load_torch_weights(model, {k[len("param/"):]: ref[k] for k in ref.files
                               if k.startswith("param/")})
    images = ref["images"].transpose(0, 2, 3, 1)  # NCHW -> NHWC
    forward = nnx.jit(lambda model, images: model(images))
    model.eval()  # BatchNorm on its running statistics
    logits = np.asarray(forward(model, images))
    model.train()  # on the batch's statistics, moving the running ones
    train_logits = np.asarray(forward(model, images))
    stats = {n: np.asarray(a) for n, a in named_parameters(model).items()
             if n.endswith(("running_mean", "running_var"))}
    out["outputs"] = {"jit": {
        "eval": worst(logits, ref["logits"]), "train": worst(train_logits, ref["train_logits"]),
        "means": max(worst(a, ref["after/" + n]) for n, a in stats.items()
                     if n.endswith("mean")),
        "variances": max(worst(a, ref["biased/" + n]) for n, a in stats.items()
                         if n.endswith("var")),
        "variances_vs_torch": max(worst(a, ref["after/" + n]) for n, a in stats.items()
                                  if n.endswith("var"))}}
    out["once"] = {"scale": float(np.abs(ref["logits"]).max())}
    return out


def resnet50_tensorflow(spec: dict[str, Any]) -> dict[str, Any]:
    """Built only, at 64x64: its trainable weights by torch's name and shape (Keras counts
    BatchNorm's moving statistics too, where torch keeps them as buffers), v1.5's strides."""
    import keras

    from pytest_dlperf.models.resnet50.tensorflow import resnet50_v15, torch_named_shapes

    model = resnet50_v15(num_classes=1000, image_size=64)
    return {"shapes": torch_named_shapes(model), "probes": {
        "strides": [list(layer.strides) for layer in model.layers  # conv1, conv2, conv3
                    if layer.name.startswith("layer2_0_conv")
                    and isinstance(layer, keras.layers.Conv2D)],
        "counted": [sum(int(np.prod(w.shape)) for w in model.trainable_weights),
                    model.count_params()]}}
