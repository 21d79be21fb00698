"""ResNet-50 v1.5 in TensorFlow: written here with Keras layer for layer in torchvision's order
(Keras' own ``keras.applications.ResNet50`` is v1: the stride on the first 1x1 conv)."""

from __future__ import annotations

from typing import Any

from ...core.workload import BuildContext, Parts
from . import NUM_CLASSES


def recipe(ctx: BuildContext) -> Parts:
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
