"""TensorFlow 2 / Keras 3: ResNet-50 v1.5 built from Keras layers, trained by a custom
``tf.function`` step under ``tf.distribute`` (MultiWorkerMirroredStrategy across ranks).

Keras' own ``keras.applications.ResNet50`` is v1 (stride 2 on the first 1x1 conv of a stage);
DLPerf measures v1.5 (stride on the 3x3 conv), so the model is written here, layer for layer in
torchvision's order: 25,557,032 trainable parameters, the same as torch's ``parameters()`` (BN
moving statistics are buffers in torch and non-trainable weights here). The algorithm matches the
torch adapter: SGD with momentum and coupled L2 weight decay on every parameter, cross-entropy on
fresh random labels every step, synthetic images resident on the device.

Runs inside a worker rank. ``tensorflow`` is imported in ``build_trainer`` only.
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import DeviceUnavailable, DistEnv, exchange

# Either wheel provides the framework: "tensorflow" (CUDA) or "tensorflow-cpu".
DISTRIBUTION = ("tensorflow", "tensorflow-cpu")

MODELS = ("resnet50",)  # the models this adapter trains

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


def tf_config(workers: list[str], rank: int) -> dict[str, Any]:
    """TF_CONFIG for MultiWorkerMirroredStrategy: every worker's address, and this one's index."""
    return {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": rank}}


_MULTI_WORKER_STARTED = False  # set once this process joined a MultiWorkerMirroredStrategy


def _own_address() -> str:
    """host:port where this rank's TensorFlow server will listen. The host is what the launcher
    says peers reach us at (loopback for local nodes), else this machine's name."""
    import socket

    host = os.environ.get("DLPERF_WORKER_HOST") or socket.gethostname()
    with socket.socket() as sock:  # a port free now; TF binds it moments later
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    return f"{host}:{port}"


def _use_gpu(tf: Any, local_rank: int) -> None:
    """Make this rank's GPU the only one TensorFlow uses, with memory grown on demand (TF
    otherwise maps nearly all of every visible GPU's memory at start-up, which hides the
    case's real footprint and starves anything beside it)."""
    gpus = tf.config.list_physical_devices("GPU")
    if local_rank >= len(gpus):
        build = tf.sysconfig.get_build_info()
        why = ("this TensorFlow build has no CUDA support (tensorflow-cpu?)"
               if not build.get("is_cuda_build") else
               "it found no usable GPU (its CUDA libraries missing or too old for the driver?)")
        raise DeviceUnavailable(
            f"the case runs on CUDA (NVML found GPUs) but TensorFlow {tf.__version__} sees "
            f"{len(gpus)} GPU(s) and this rank has local rank {local_rank}: {why}. Install "
            "the CUDA wheel (pip install 'tensorflow[and-cuda]'; scripts/setup does on a GPU "
            "host) or run with --dlperf-device cpu")
    try:  # only possible before TF's runtime starts (always true in a fresh worker)
        tf.config.set_visible_devices(gpus[local_rank], "GPU")
        tf.config.experimental.set_memory_growth(gpus[local_rank], True)
    except RuntimeError:
        pass


class TensorFlowTrainer:
    def __init__(self, spec: dict[str, Any], dist: DistEnv) -> None:
        threads = int(spec["threads"])
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.cuda = spec["device_type"] == "cuda"
        global _MULTI_WORKER_STARTED
        if dist.world_size > 1 and _MULTI_WORKER_STARTED:
            # TensorFlow configures its collectives once per process: a second multi-worker
            # case in the same process would hang. Only external mode (training inside pytest)
            # can get here; the other launchers start fresh ranks for every case.
            raise RuntimeError(
                "TensorFlow's MultiWorkerMirroredStrategy can be set up only once per process, "
                "and this rank already ran a multi-worker TensorFlow case; under "
                "--dlperf-launcher external select one TensorFlow case per pytest run (-k), or "
                "use the local or slurm launcher, which start new ranks for every case")
        if dist.world_size > 1:
            _MULTI_WORKER_STARTED = True
            workers = spec.get("workers") or exchange(dist, "tf-workers", _own_address())
            if len(workers) != dist.world_size:
                raise ValueError(f"tensorflow needs one address per rank (world size "
                                 f"{dist.world_size}), got {workers!r}")
            os.environ["TF_CONFIG"] = json.dumps(tf_config(workers, dist.rank))
        if not self.cuda:
            os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
        import keras
        import tensorflow as tf

        self._tf = tf
        if self.cuda:
            _use_gpu(tf, dist.local_rank)
        try:  # only possible before TF's runtime starts (always true in a fresh worker)
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1 if threads == 1 else 2)
        except RuntimeError:
            pass
        self.amp = spec["precision"] == "amp"
        # fp16 needs loss scaling (LossScaleOptimizer); bf16 keeps fp32's exponent range.
        policy = ("mixed_float16" if self.cuda else "mixed_bfloat16") if self.amp else "float32"
        keras.mixed_precision.set_global_policy(policy)
        if dist.world_size > 1:
            implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL
                              if self.cuda else
                              tf.distribute.experimental.CommunicationImplementation.RING)
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=tf.distribute.experimental.CommunicationOptions(
                    implementation=implementation))
        else:
            self.strategy = tf.distribute.get_strategy()
        keras.utils.set_random_seed(int(spec["seed"]) + dist.rank)

        batch, size = int(spec["batch_size"]), int(spec["image_size"])
        self.num_classes = int(spec["num_classes"])
        opt = spec["optimizer"]
        self.weight_decay = float(opt["weight_decay"])
        with self.strategy.scope():
            self.model = resnet50_v15(self.num_classes, size)
            optimizer = keras.optimizers.SGD(learning_rate=opt["lr"], momentum=opt["momentum"])
            self.loss_scaled = self.amp and self.cuda
            if self.loss_scaled:
                optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
                # Built now, so the step traces against the live loss scale (an unbuilt one
                # would bake its initial scale into the graph).
                optimizer.build(self.model.trainable_variables)
            self.optimizer = optimizer
            # Synthetic data resident on the device, as DLPerf's synthetic-data runs.
            self.images = tf.Variable(tf.random.normal((batch, size, size, 3)), trainable=False)
        self.parameters = int(sum(int(tf.size(w)) for w in self.model.trainable_weights))
        self.batch = batch
        self.global_batch = batch * dist.world_size
        self.jit = spec.get("compiler", "eager") == "compiled"  # XLA
        self._step = tf.function(self._replica_step, jit_compile=self.jit)
        self._loss: Any = None

    def _replica_step(self) -> Any:
        tf = self._tf
        labels = tf.random.uniform((self.batch,), 0, self.num_classes, dtype=tf.int32)
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model(self.images, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
            scaled = self.optimizer.scale_loss(loss) if self.loss_scaled else loss
        grads = tape.gradient(scaled, variables)
        # torch's SGD weight_decay: coupled L2 on every parameter (Keras' is decoupled). Under
        # loss scaling the gradients are still scaled here (apply_gradients unscales them), so
        # the decay term is scaled too, or fp16 runs would decay by 1/scale of what fp32 does.
        decay = self.weight_decay * (self.optimizer.dynamic_scale if self.loss_scaled else 1.0)
        grads = [g + tf.cast(decay, g.dtype) * tf.cast(v, g.dtype)
                 for g, v in zip(grads, variables)]
        self.optimizer.apply_gradients(zip(grads, variables))
        return loss

    def step(self) -> None:
        # The per-replica loss is kept as it is: reducing it here would add a cross-worker
        # all-reduce and a host round trip to every timed step. It is reduced only when read.
        self._loss = self.strategy.run(self._step)

    def _reduced_loss(self) -> Any:
        return self.strategy.reduce(self._tf.distribute.ReduceOp.MEAN, self._loss, axis=None)

    def synchronize(self) -> None:
        # Kernels may still be queued when step() returns (always on GPU). sync_devices waits for
        # every local device; it refuses multi-worker contexts, where the all-reduced loss of
        # the last step (which needs every step before it, on every replica) is fetched instead.
        sync = getattr(self._tf.test.experimental, "sync_devices", None)
        if sync is not None and self.strategy.num_replicas_in_sync == 1:
            sync()
        if self._loss is not None:
            self._reduced_loss().numpy()

    def loss(self) -> float:
        return float(self._reduced_loss().numpy()) if self._loss is not None else 0.0

    def environment(self) -> dict[str, Any]:
        tf = self._tf
        import keras

        env: dict[str, Any] = {
            "framework": "tensorflow",
            "framework_version": tf.__version__,
            "keras": keras.__version__,
            "threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "parameters": self.parameters,
            "replicas": self.strategy.num_replicas_in_sync,
            "data_parallel_ranks": self.strategy.num_replicas_in_sync,
            "jit_compile": self.jit,
        }
        if self.cuda:
            build = tf.sysconfig.get_build_info()
            env.update(cuda=build.get("cuda_version"), cudnn=build.get("cudnn_version"))
        return env

    def close(self) -> None:
        pass


def build_trainer(spec: dict[str, Any], dist: DistEnv) -> TensorFlowTrainer:
    return TensorFlowTrainer(spec, dist)
