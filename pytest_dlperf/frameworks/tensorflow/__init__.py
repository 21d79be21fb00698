"""TensorFlow 2 / Keras 3: a workload's Keras model, trained by a custom ``tf.function`` step
under ``tf.distribute`` (MultiWorkerMirroredStrategy across ranks).

The algorithm matches the torch adapter: the workload's optimizer (SGD with momentum and coupled
L2 weight decay on every parameter, or AdamW), gradients averaged across replicas then clipped
to a global norm where the workload asks, the workload's loss (default: cross-entropy of logits
against integer labels), its synthetic batch resident on the device. The recipe runs under the strategy's scope, after the
mixed-precision policy is set, so its layers compute in the AMP dtype.

Runs inside a worker rank. ``tensorflow`` is imported in ``build_trainer`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...core.spec import OptimizerSpec, RankSpec
from ...core.strategies import Unported, register_strategy
from ...core.workload import BuildContext, Parts, WorkloadError
from .. import DistEnv, PhasePlan, _optim, fresh, require_parameters
from .._loss_scale import POLICY
from .._step import OnRuntime, RuntimePeaks
from . import phases
from .adamw import torch_adamw
from .runtime import TensorFlowRuntime

# Either wheel provides the framework: "tensorflow" (CUDA) or "tensorflow-cpu".
DISTRIBUTION = ("tensorflow", "tensorflow-cpu")

INSTALL_HINT = None  # the pip extra
RECIPE_FOR = "tensorflow"
COMPILER = "XLA"  # jit_compile=True


class TensorFlowTrainer(RuntimePeaks, OnRuntime):
    """A workload's Keras model, loss and optimizer trained on a rank's ``TensorFlowRuntime``
    (under its strategy), one traced step at a time."""

    runtime: TensorFlowRuntime

    def __init__(self, spec: RankSpec, dist: DistEnv,
                 recipe: Callable[[BuildContext], Parts]) -> None:
        self.runtime = TensorFlowRuntime(spec, dist)
        tf = self._tf = self.runtime.tf
        keras = self.runtime.keras
        self.strategy = self.runtime.strategy
        precision = spec.precision

        opt = spec.optimizer
        self.coupled_decay = float(opt.weight_decay) if opt.kind == "sgd" else 0.0
        self.clip_norm = opt.clip_norm
        device = f"cuda:{dist.local_rank}" if self.cuda else "cpu"
        with self.strategy.scope():
            parts = recipe(spec.context(dist.rank, dist.world_size, dist.local_rank, device))
            if parts.data is not None:
                raise WorkloadError("the TensorFlow adapter takes a synthetic batch "
                                    "(Parts.inputs and targets), not an iterator of batches "
                                    "(Parts.data): give inputs and targets")
            self.model = parts.model
            optimizer = make_optimizer(keras, self.model.trainable_variables, opt)
            self.loss_scaled = precision.loss_scaling
            if self.loss_scaled:
                optimizer = loss_scale_optimizer(keras, optimizer)
                # Built now, so the step traces against the live loss scale (an unbuilt one
                # would bake its initial scale into the graph).
                optimizer.build(self.model.trainable_variables)
            self.optimizer = optimizer
            # Synthetic data resident on the device, as DLPerf's synthetic-data runs.
            self.inputs = tf.nest.map_structure(self._resident, parts.inputs)
            self.targets = (parts.targets if callable(parts.targets)
                            else tf.nest.map_structure(self._resident, parts.targets))
        self.criterion = parts.loss or _cross_entropy
        self.parameters = int(sum(int(tf.size(w)) for w in self.model.trainable_weights))
        if self.model.built:  # an unbuilt Keras model has no weights yet, whatever it holds
            require_parameters(self.parameters, recipe)
        self.jit = spec.compiled  # XLA
        # XLA compiles a cross-worker all-reduce only as NCCL's: on CPU TensorFlow refuses the
        # ring ("Only compiling NCCL/auto collective is supported") and auto alike ("Collectives
        # are not yet implemented for CPU devices when compiling with XLA"). There XLA compiles
        # the step on either side of the all-reduce; on CUDA and on one worker, all of it.
        self.xla_around_all_reduce = (self.jit and not self.cuda
                                      and self.strategy.num_replicas_in_sync > 1)
        if self.xla_around_all_reduce:
            self._gradients = tf.function(self._forward_backward, jit_compile=True)
            self._update = tf.function(self._apply, jit_compile=True)
        self._step = self.traced_step()
        self._local = tf.function(self._replica_local, jit_compile=self.jit)
        self._loss: Any = None
        self._local_loss: Any = None

    def _resident(self, value: Any) -> Any:
        if callable(value):
            return value
        return self._tf.Variable(value, trainable=False)

    def traced_step(self, communicate: bool = True) -> Callable[[], Any]:
        """The whole step, one ``tf.function``. Without ``communicate`` it is the same step
        less the gradients' all-reduce, traced apart (the phases' steps without communication,
        ``phases``); the timed windows run only the one with it."""
        tf = self._tf
        if self.xla_around_all_reduce:
            around: Callable[[], Any] = tf.function(
                lambda: self._step_around_all_reduce(communicate))
            return around
        whole = tf.function(lambda: self._replica_step(communicate), jit_compile=self.jit)
        return lambda: self.strategy.run(whole)

    def _replica_step(self, communicate: bool = True) -> Any:
        loss, grads = self._forward_backward()
        self._apply(self._all_reduce(grads) if communicate else grads)
        return loss

    def _step_around_all_reduce(self, communicate: bool = True) -> Any:
        """The step as three replica calls, the first and last compiled by XLA. The update is
        itself the function ``strategy.run`` calls: nested in another ``tf.function`` inside
        one, ``apply_gradients``' merge_call is refused."""
        loss, grads = self.strategy.run(self._gradients)
        if communicate:
            grads = self.strategy.run(self._all_reduce, args=(grads,))
        self.strategy.run(self._update, args=(grads,))
        return loss

    def _all_reduce(self, grads: list[Any]) -> Any:
        if self.strategy.num_replicas_in_sync == 1:
            return grads
        # The data-parallel all-reduce, here and not in apply_gradients (make_optimizer turns
        # Keras' off): the mean, like DDP's, so that every replica clips and checks the same
        # averaged gradients, as torch does. Keras would sum the per-replica gradients inside
        # apply_gradients, after clipping them one replica at a time.
        replicas = self._tf.distribute.get_replica_context()
        return replicas.all_reduce(self._tf.distribute.ReduceOp.MEAN, grads)

    def _forward_backward(self) -> tuple[Any, list[Any]]:
        """This replica's loss and its gradients (of the scaled loss, under loss scaling)."""
        tf = self._tf
        inputs, targets = fresh(self.inputs), fresh(self.targets)
        with tf.GradientTape() as tape:
            outputs = self.model(inputs, training=True)  # a tuple is a multi-input model's
            loss = self.criterion(outputs, targets)
            scaled = self.optimizer.scale_loss(loss) if self.loss_scaled else loss
        return loss, tape.gradient(scaled, self.model.trainable_variables)

    def _apply(self, grads: list[Any]) -> None:
        """The update from the all-reduced gradients: clip, coupled decay, optimizer."""
        tf = self._tf
        variables = self.model.trainable_variables
        scale = self.optimizer.dynamic_scale if self.loss_scaled else None
        if self.clip_norm is not None:
            # Global-norm clipping of the unscaled gradients, done on the scaled ones with the
            # bound scaled alike (an inf gradient makes them all NaN, and the loss-scale
            # optimizer then skips the step, as torch's GradScaler does).
            bound = self.clip_norm * (scale if scale is not None else 1.0)
            grads, _ = tf.clip_by_global_norm(grads, tf.cast(bound, tf.float32))
        if self.coupled_decay:
            # torch's SGD weight_decay: coupled L2 on every parameter (Keras' is decoupled).
            # Under loss scaling the gradients are still scaled here (apply_gradients unscales
            # them), so the decay term is scaled too, or fp16 runs would decay by 1/scale of
            # what fp32 does.
            decay = self.coupled_decay * (scale if scale is not None else 1.0)
            grads = [g + tf.cast(decay, g.dtype) * tf.cast(v, g.dtype)
                     for g, v in zip(grads, variables)]
        self.optimizer.apply_gradients(zip(grads, variables))

    def _replica_local(self) -> Any:
        """Forward and backward of this replica alone: no all-reduce, no update."""
        tf = self._tf
        inputs, targets = fresh(self.inputs), fresh(self.targets)
        with tf.GradientTape() as tape:
            outputs = self.model(inputs, training=True)
            loss = self.criterion(outputs, targets)
        grads = tape.gradient(loss, self.model.trainable_variables)
        # The loss, released once every gradient is computed: reading it waits for the whole
        # backward pass, and keeps the gradients from being pruned from the graph.
        with tf.control_dependencies([g for g in grads if g is not None]):
            return tf.identity(loss)

    @property
    def local_step(self) -> Callable[[], None] | None:
        return self._local_step

    def _local_step(self) -> None:
        """The straggler check's measure of this rank's own speed (docs/resources.md "Stragglers")."""
        self._local_loss = self.strategy.run(self._local)

    def local_synchronize(self) -> None:
        if self._local_loss is not None:
            for value in self.strategy.experimental_local_results(self._local_loss):
                value.numpy()

    def step(self) -> None:
        # The per-replica loss is kept as it is: reducing it here would add a cross-worker
        # all-reduce and a host round trip to every timed step. It is reduced only when read.
        self._loss = self._step()

    def phase_plan(self) -> PhasePlan:
        """The step in phases (``phases``)."""
        return phases.plan(self)

    def _reduced_loss(self) -> Any:
        return self.strategy.reduce(self._tf.distribute.ReduceOp.MEAN, self._loss, axis=None)

    def synchronize(self) -> None:
        # Kernels may still be queued when step() returns (always on GPU): the devices waited
        # for where TensorFlow can, and the all-reduced loss of the last step fetched (it needs
        # every step before it, on every replica).
        self.runtime.wait_for_devices()
        if self._loss is not None:
            self._reduced_loss().numpy()

    def loss(self) -> float:
        return float(self._reduced_loss().numpy()) if self._loss is not None else 0.0

    def environment(self) -> dict[str, Any]:
        env = self.runtime.environment()
        env.update(parameters=self.parameters, jit_compile=self.jit,
                   xla_compiles=(None if not self.jit else
                                 "forward-backward and update, not the all-reduce"
                                 if self.xla_around_all_reduce else "the step"))
        return env


def loss_scale_optimizer(keras: Any, optimizer: Any) -> Any:
    """``optimizer`` under Keras's dynamic loss scale, on the one policy
    (``_loss_scale.POLICY``; Keras's own starts at 2^15). Its factor is 2, up and down."""
    assert (POLICY.growth, POLICY.backoff) == (2.0, 0.5), "Keras scales by 2, up and down"
    return keras.mixed_precision.LossScaleOptimizer(
        optimizer, initial_scale=POLICY.initial, dynamic_growth_steps=POLICY.interval)


def make_optimizer(keras: Any, variables: list[Any], opt: OptimizerSpec) -> Any:
    """The workload's Keras optimizer (``_optim``: the kind, which variables decay), its
    cross-replica gradient sum switched off: the adapter's step all-reduces (and clips) the
    gradients before ``apply_gradients``. Keras' own: its optimizer API (SGD's coupled decay is
    the step's, ``_apply``, Keras' decay being decoupled; AdamW told its exempt variables)."""
    def adamw() -> Any:
        # torch's update, not Keras' (epsilon's place, sparse gradients): adamw
        optimizer = torch_adamw(keras, learning_rate=opt.lr, weight_decay=opt.weight_decay,
                                beta_1=opt.betas[0], beta_2=opt.betas[1], epsilon=opt.eps)
        optimizer.exclude_from_weight_decay(var_list=_optim.decay_split(variables, opt)[1])
        return optimizer

    optimizer = _optim.build(
        "tensorflow", opt, adamw=adamw,
        sgd=lambda: keras.optimizers.SGD(learning_rate=opt.lr, momentum=opt.momentum))
    if not callable(getattr(optimizer, "_all_reduce_sum_gradients", None)):
        # Keras 3's TensorFlow optimizer sums gradients across replicas in this method; if a
        # release moves it, gradients would be reduced twice (doubled): refuse instead.
        raise RuntimeError(f"Keras {keras.__version__}'s optimizer has no "
                           "_all_reduce_sum_gradients to switch off; pytest-dlperf's "
                           "TensorFlow adapter needs updating for this Keras release")
    optimizer._all_reduce_sum_gradients = list  # already reduced by the step: pass through
    return optimizer


def _cross_entropy(logits: Any, labels: Any) -> Any:
    import tensorflow as tf

    logits = tf.cast(logits, tf.float32)  # accurate softmax whatever the AMP dtype
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))


# Not ported, for what the installed stack offers (read 2026-11-25 in TensorFlow 2.21 and Keras
# 3.15.1): TensorFlow's sharding API is DTensor (``tf.experimental.dtensor``, parts of it
# deprecated), which shards variables created with DTensor layouts; the recipes return Keras 3
# models, and Keras 3's distribution API (``ModelParallel``, ``LayoutMap``) has no TensorFlow
# implementation (its TF backend module says "DO NOT USE ... just a prototype" and defines no
# ``distribute_variable``). Keras 2 (``tf_keras``), whose layout maps did, is not installed.
# Pipelines have no TensorFlow API at all.
_NOT_PORTED = ("TensorFlow's layouts are DTensor's, and Keras 3 (the recipes' models) does not "
               "shard variables with it: its TensorFlow distribution backend is an unfinished "
               "prototype ('DO NOT USE'); not ported")
for _kind in ("fsdp", "tp", "pp"):
    register_strategy("tensorflow", Unported(_kind, _NOT_PORTED))
# Row-split tables, measured 2026-11-29 on two CPU clients (DTensor, a table with layout
# ["x", unsharded] looked up by tf.gather); MultiWorkerMirroredStrategy only mirrors variables.
register_strategy("tensorflow", Unported(
    "emb", "Keras 3 does not shard variables on TensorFlow, and DTensor refuses a row-split "
           "table's lookup: 'DTensor does not support sharded 0th dimension for the resource "
           "tensor for ResourceGatherOp. Please unshard dimension 0'"))


def amp_unavailable(device_type: str) -> str | None:
    return None  # Keras' mixed_bfloat16 on CPU, mixed_float16 with loss scaling on CUDA


def compile_unavailable(device_type: str) -> str | None:
    return None  # XLA (jit_compile) on CPU and CUDA (across CPU workers, around the all-reduce)


def eager_unavailable(device_type: str) -> str | None:
    return None  # tf.function without jit_compile


def build_trainer(spec: RankSpec, dist: DistEnv,
                  recipe: Callable[[BuildContext], Parts] | None) -> TensorFlowTrainer:
    if recipe is None:
        raise ValueError("the tensorflow adapter needs the workload's tensorflow recipe")
    return TensorFlowTrainer(spec, dist, recipe)
