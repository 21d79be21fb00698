"""ResNet-50 v1.5, DLPerf's first model: its recipe per framework.

The GPU sizes are DLPerf's (224x224, batch 128 FP32 / 256 AMP per device). The CPU sizes keep the
same model and algorithm but few pixels and tiny batches, so a 2-core machine runs a case in
seconds: the point on CPU is the harness, not the number. The algorithm is the same everywhere:
SGD with momentum 0.9 and coupled L2 weight decay 1e-4 on every parameter (lr 0.1 per 256 samples
of global batch), cross-entropy on fresh random labels every step, synthetic images resident on
the device.

torch, OneFlow and Paddle use their zoos' ResNet-50 (torchvision, flowvision and
``paddle.vision``: v1.5, stride 2 on the 3x3 conv). Keras' own ``keras.applications.ResNet50``
is v1 (stride on the first 1x1 conv), so the Keras model is written here, layer for layer in
torchvision's order: 25,557,032 trainable parameters, the same as torch's ``parameters()`` (BN
moving statistics are buffers in torch, non-trainable weights in Keras and non-trainable
parameters in Paddle and MindSpore). MindSpore's is written from ``mindspore.nn`` under
torchvision's names in ``mindspore``, which says why not mindcv's, and MXNet's from
``mxnet.gluon.nn`` in ``mxnet`` (its model zoo's ``resnet50_v1`` is v1).

This module holds the workload alone (the pytest side imports it); each framework's recipe is its
module here (``torch``, ``tensorflow``, ``oneflow``, ``paddle``, ``mindspore``, ``mxnet``, ``jax``),
imported by the ranks of that framework only.
"""

from __future__ import annotations

from ...core.workload import SGD, Workload

NUM_CLASSES = 1000
PARAMETERS = 25_557_032  # torchvision's resnet50: what every framework's model must have

WORKLOAD = Workload(
    name="resnet50",
    unit="images",
    batch_size={"cuda": 128, "cuda/amp": 256, "cpu": 2},
    # 64x64 leaves 2x2 maps after layer4. At 32x32 (1x1 maps) BatchNorm over a batch of 2
    # normalizes two values to +-1 whatever they were, and the loss climbs into the thousands.
    sizes={"image_size": {"cuda": 224, "cpu": 64}},
    optimizer=SGD(lr_per_256=0.1, momentum=0.9, weight_decay=1e-4),
    recipes={
        "torch": "pytest_dlperf.models.resnet50.torch:recipe",
        "tensorflow": "pytest_dlperf.models.resnet50.tensorflow:recipe",
        "oneflow": "pytest_dlperf.models.resnet50.oneflow:recipe",
        "paddle": "pytest_dlperf.models.resnet50.paddle:recipe",
        "mindspore": "pytest_dlperf.models.resnet50.mindspore:recipe",
        "mxnet": "pytest_dlperf.models.resnet50.mxnet:recipe",
        "jax": "pytest_dlperf.models.resnet50.jax:recipe",
    },
)

