"""The port job's InsightFace ports (tests/port_job.py): each backbone and margin a port checks,
built at the CPU sizes with ``CLASSES`` classes, its parameters against torch's by name and
shape, then torch's weights (tests/port_references.py's reference) on torch's two faces in
training mode (BatchNorm on the batch's statistics, the margin and scale of ArcFace or
CosFace), under the framework's interpreter: no pytest, the framework imported inside its
function only.

Measured with OneFlow 0.9 and MXNet 1.9.1 on CPU (2026-11-29): the loss equal to torch's in
float32 (MXNet's IResNet-18 eager 1.7e-6 apart, relative), MXNet's head gradient within 3.7e-5
and 2.9e-4 of its largest (through BatchNorm over a batch of two). With no margin the loss is
not torch's (seen failing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# What each framework checks, and on what: (backbone-margin, classes). OneFlow's at 100 classes
# on two faces from a seeded generator; MXNet's at 11, as first measured (torch's model from
# seed 0, then the faces, labels 3 and 7): on OneFlow's faces MXNet's MobileFaceNet-ArcFace
# loss read 1.3e-5 from torch's (relative; 2026-12-07), past the bound measured on its own.
CHECKED = {"oneflow": (("mobilefacenet-arcface", 100), ("mobilefacenet-cosface", 100),
                       ("iresnet18-arcface", 100)),
           "mxnet": (("mobilefacenet-arcface", 11), ("iresnet18-cosface", 11))}


# The table's shapes (tests/ports.py's totals, port_references.torch_shapes): this model's.
TABLE = ("mobilefacenet-arcface", 100)


def key(variant: str, classes: int) -> str:
    return f"{variant}-{classes}"


def sizes(variant: str, classes: int) -> dict[str, Any]:
    from pytest_dlperf.models.insightface import CPU_SIZES

    backbone, margin = variant.split("-")
    return {**CPU_SIZES, "num_classes": classes, "backbone": backbone, "margin": margin}


def torchs(ref: Any, variant: str) -> list[list[Any]]:
    """torch's parameters of ``variant`` (a ``key``) by name and shape, in its order."""
    prefix = f"{variant}/param/"
    return [[k[len(prefix):], list(ref[k].shape)] for k in ref.files if k.startswith(prefix)]


def torchs_state(ref: Any, variant: str) -> dict[str, Any]:
    """torch's ``state_dict()`` of ``variant``: parameters and BatchNorm's statistics."""
    return {k.split("/", 2)[2]: ref[k] for k in ref.files
            if k.startswith((f"{variant}/param/", f"{variant}/buffer/"))}


def relative(got: float, variant: str, ref: Any) -> float:
    return float(abs(got - float(ref[f"{variant}/loss"])) / abs(float(ref[f"{variant}/loss"])))


def insightface_oneflow(spec: dict[str, Any]) -> dict[str, Any]:
    """MobileFaceNet with ArcFace and with CosFace, IResNet-18 with ArcFace: torch's parameters
    by name and shape in torch's order (``shapes``: ``TABLE``'s; ``variants``: whether each
    has them), the head normal with std 0.01 (``head``), torch's loss from torch's weights."""
    import oneflow as flow

    from pytest_dlperf.models.insightface import FaceShape
    from pytest_dlperf.models.insightface.oneflow import build

    ref = np.load(spec["reference"])
    out: dict[str, Any] = {"probes": {"variants": {}, "head": {}}, "once": {}}
    losses = []
    for name, classes in CHECKED["oneflow"]:
        variant = key(name, classes)
        images, labels = (flow.tensor(ref[f"{variant}/{k}"]) for k in ("images", "labels"))
        model = build(FaceShape.of(sizes(name, classes)))
        head = model.head.weight.numpy().copy()
        shapes = [[n, list(p.shape)] for n, p in model.named_parameters()]
        if (name, classes) == TABLE:
            out["shapes"] = dict(shapes)
        out["probes"]["variants"][variant] = shapes == torchs(ref, variant)
        out["probes"]["head"][variant] = [float(head.std()), float(head.mean())]
        model.load_state_dict({n: flow.tensor(a) for n, a in torchs_state(ref, variant).items()},
                              strict=False)
        with flow.no_grad():
            losses.append(relative(float(model(images, labels)), variant, ref))
    out["outputs"] = {"eager": {"loss": max(losses)}}
    return out


def insightface_mxnet(spec: dict[str, Any]) -> dict[str, Any]:
    """MobileFaceNet with ArcFace, IResNet-18 with CosFace, eager and hybridized: torch's
    trained parameters by name and shape (``variants``: whether each has them, in MXNet's own
    order; ``shapes``: ``TABLE``'s), torch's loss and head gradient from torch's
    weights."""
    import mxnet as mx
    from mxnet import autograd

    from pytest_dlperf.models.insightface import FaceShape
    from pytest_dlperf.models.insightface.mxnet import build, load_torch_weights, named_parameters

    ref = np.load(spec["reference"])
    out: dict[str, Any] = {"probes": {"variants": {}}, "once": {}, "outputs": {}}
    for mode in ("eager", "hybridized"):
        figures: dict[str, list[float]] = {"loss": [], "head_grad": []}
        for name, classes in CHECKED["mxnet"]:
            variant = key(name, classes)
            images = mx.nd.array(ref[f"{variant}/images"])
            labels = mx.nd.array(ref[f"{variant}/labels"], dtype="int32")
            model = build(FaceShape.of(sizes(name, classes)))
            load_torch_weights(model, torchs_state(ref, variant))
            if mode == "hybridized":
                model.hybridize(static_alloc=True, static_shape=True)
            with autograd.record():  # training mode: BatchNorm on the batch's statistics
                loss = model(images, labels)
            loss.backward()
            params = named_parameters(model)
            trained = {n: list(p.shape) for n, p in params.items() if p.grad_req != "null"}
            # MXNet's own order (Gluon collects the children as it registered them)
            out["probes"]["variants"][variant] = sorted(trained.items()) == sorted(
                (n, s) for n, s in torchs(ref, variant))
            grad, wanted = params["head.weight"].grad().asnumpy(), ref[f"{variant}/head_grad"]
            figures["loss"].append(relative(float(loss.asscalar()), variant, ref))
            figures["head_grad"].append(float(np.abs(grad - wanted).max() / np.abs(wanted).max()))
        out["outputs"][mode] = {name: max(values) for name, values in figures.items()}
    # The table's shapes (a forward first: Gluon infers some shapes from the data)
    model = build(FaceShape.of(sizes(*TABLE)))
    model(images, mx.nd.array([3, 7], dtype="int32"))
    out["shapes"] = {n: list(p.shape) for n, p in named_parameters(model).items()
                     if p.grad_req != "null"}
    return out
