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
torchvision's names in ``resnet50_mindspore``, which says why not mindcv's, and MXNet's from
``mxnet.gluon.nn`` in ``resnet50_mxnet`` (its model zoo's ``resnet50_v1`` is v1).

Frameworks are imported inside the recipes only (this module is imported on the pytest side).
"""

from __future__ import annotations

from typing import Any

from ..core.workload import SGD, BuildContext, Parts, Workload

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
        "torch": "pytest_dlperf.models.resnet50:torch_recipe",
        "tensorflow": "pytest_dlperf.models.resnet50:tensorflow_recipe",
        "oneflow": "pytest_dlperf.models.resnet50:oneflow_recipe",
        "paddle": "pytest_dlperf.models.resnet50:paddle_recipe",
        "mindspore": "pytest_dlperf.models.resnet50_mindspore:recipe",
        "mxnet": "pytest_dlperf.models.resnet50_mxnet:recipe",
        "jax": "pytest_dlperf.models.resnet50_jax:recipe",
    },
)


def torch_recipe(ctx: BuildContext) -> Parts:
    import torch
    import torchvision

    # channels_last on CUDA: cuDNN's fastest convolutions (tensor cores) want NHWC; moving the
    # model to the device keeps the format.
    fmt = torch.channels_last if ctx.device_type == "cuda" else torch.contiguous_format
    model = torchvision.models.resnet50(num_classes=NUM_CLASSES).to(memory_format=fmt)
    size = int(ctx.sizes["image_size"])
    images = torch.randn(ctx.batch_size, 3, size, size, device=ctx.device).contiguous(
        memory_format=fmt)
    labels = torch.zeros(ctx.batch_size, dtype=torch.long, device=ctx.device)

    def fresh_labels() -> Any:  # one tiny kernel, in place
        return torch.randint(0, NUM_CLASSES, labels.shape, out=labels)

    return Parts(model=model, inputs=images, targets=fresh_labels)


def oneflow_recipe(ctx: BuildContext) -> Parts:
    import flowvision
    import oneflow as flow

    model = flowvision.models.resnet50(num_classes=NUM_CLASSES)
    size = int(ctx.sizes["image_size"])
    images = flow.randn(ctx.batch_size, 3, size, size, device=ctx.device)

    def fresh_labels() -> Any:
        return flow.randint(0, NUM_CLASSES, (ctx.batch_size,), device=ctx.device)

    return Parts(model=model, inputs=images, targets=fresh_labels)


def paddle_recipe(ctx: BuildContext) -> Parts:
    import paddle

    # The adapter has made the case's device Paddle's current one: tensors are created there.
    model = paddle.vision.models.resnet50(num_classes=NUM_CLASSES)
    size = int(ctx.sizes["image_size"])
    images = paddle.randn([ctx.batch_size, 3, size, size])

    def fresh_labels() -> Any:
        return paddle.randint(0, NUM_CLASSES, [ctx.batch_size])

    return Parts(model=model, inputs=images, targets=fresh_labels)


def paddle_torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """Paddle's trainable parameters under torchvision's names, in torch's layout: the names
    are torchvision's already (``paddle.vision`` follows it; BatchNorm's running statistics,
    ``_mean`` and ``_variance``, are non-trainable parameters and left out), and a Linear
    weight is (in, out) in Paddle, (out, in) in torch."""
    shapes = {}
    for name, param in model.named_parameters():
        if param.stop_gradient:
            continue
        shape = tuple(int(d) for d in param.shape)
        shapes[name] = shape[::-1] if len(shape) == 2 else shape
    return shapes


def tensorflow_recipe(ctx: BuildContext) -> Parts:
    import tensorflow as tf

    size = int(ctx.sizes["image_size"])
    model = resnet50_v15(NUM_CLASSES, size)
    images = tf.random.normal((ctx.batch_size, size, size, 3))

    def fresh_labels() -> Any:  # traced into the step: drawn on the device every step
        return tf.random.uniform((ctx.batch_size,), 0, NUM_CLASSES, dtype=tf.int32)

    return Parts(model=model, inputs=images, targets=fresh_labels)


BN_EPSILON, BN_MOMENTUM = 1e-5, 0.9  # torch's BatchNorm2d defaults (momentum 0.1 = 1 - 0.9)


def resnet50_v15(num_classes: int = 1000, image_size: int = 224) -> Any:
    """ResNet-50 v1.5 (channels last), in torchvision's layer order."""
    import keras
    from keras import layers

    def bn(x: Any, name: str) -> Any:
        return layers.BatchNormalization(epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name=name)(x)

    def conv(x: Any, filters: int, kernel: int, stride: int, name: str) -> Any:
        if kernel > 1:  # torch pads symmetrically; Keras "same" would pad right/bottom only
            x = layers.ZeroPadding2D(kernel // 2, name=f"{name}_pad")(x)
        return layers.Conv2D(filters, kernel, strides=stride, use_bias=False, name=name)(x)

    def bottleneck(x: Any, filters: int, stride: int, downsample: bool, name: str) -> Any:
        out = layers.ReLU()(bn(conv(x, filters, 1, 1, f"{name}_conv1"), f"{name}_bn1"))
        # v1.5: the stride sits on the 3x3 conv, not on the first 1x1.
        out = layers.ReLU()(bn(conv(out, filters, 3, stride, f"{name}_conv2"), f"{name}_bn2"))
        out = bn(conv(out, filters * 4, 1, 1, f"{name}_conv3"), f"{name}_bn3")
        if downsample:
            x = bn(conv(x, filters * 4, 1, stride, f"{name}_downsample_conv"),
                   f"{name}_downsample_bn")
        return layers.ReLU()(layers.Add()([out, x]))

    inputs = keras.Input((image_size, image_size, 3))
    x = layers.ReLU()(bn(conv(inputs, 64, 7, 2, "conv1"), "bn1"))
    x = layers.ZeroPadding2D(1)(x)
    x = layers.MaxPooling2D(3, strides=2)(x)
    for stage, (filters, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3)), start=1):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 1 else 1
            x = bottleneck(x, filters, stride, block == 0, f"layer{stage}_{block}")
    x = layers.GlobalAveragePooling2D()(x)
    # Logits in float32 under mixed precision: the softmax cross-entropy stays accurate.
    outputs = layers.Dense(num_classes, dtype="float32", name="fc")(x)
    return keras.Model(inputs, outputs, name="resnet50_v15")


def torch_named_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The trainable weights under torchvision's parameter names, in torch's layout (conv OIHW,
    linear out x in): what the cross-framework alignment test compares with torch's
    ``named_parameters()``, layer by layer."""
    import re

    renames = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias"}
    shapes = {}
    for weight in model.trainable_weights:
        layer, _, kind = weight.path.rpartition("/")
        name = re.sub(r"^layer(\d)_(\d+)_", r"layer\1.\2.", layer)
        name = name.replace("downsample_conv", "downsample.0").replace("downsample_bn",
                                                                         "downsample.1")
        shape = tuple(int(d) for d in weight.shape)
        if len(shape) == 4:  # Keras HWIO -> torch OIHW
            shape = (shape[3], shape[2], shape[0], shape[1])
        elif len(shape) == 2:  # Keras (in, out) -> torch (out, in)
            shape = (shape[1], shape[0])
        shapes[f"{name}.{renames[kind]}"] = shape
    return shapes


