"""MindSpore: a workload's ``nn.Cell`` trained by ``mindspore.value_and_grad`` and an optimizer
Cell, in PyNative mode (``eager``) or with the whole training step compiled by
``mindspore.jit`` (``compiled``: GRAPH mode, what MindSpore's own training scripts run).

MindSpore 2.10 needs numpy < 2, so its ranks usually run under their own interpreter
(``--dlperf-python mindspore=PATH``; ``scripts/setup-mindspore`` makes one). They are started by
the plugin's launchers like every framework's, not by ``msrun``: MindSpore's dynamic cluster
takes its roles from environment variables (``MS_ROLE``, ``MS_SCHED_HOST``, ``MS_SCHED_PORT``,
``MS_WORKER_NUM``, ``MS_NODE_ID``), which the adapter sets from the launcher's RANK /
WORLD_SIZE / MASTER_ADDR before MindSpore is imported; the cluster's scheduler (``MS_SCHED``, a
process that registers the workers and runs no training) is started by rank 0, on the first
node, at the launcher's spare port (``DLPERF_FRAMEWORK_PORT``: torchrun's agent store holds
MASTER_PORT), as ``msrun`` would start it. ``MS_NODE_ID`` is the launcher's rank, so MindSpore's
rank ids are the launcher's. Gradients are averaged by ``nn.DistributedGradReducer`` (MindSpore's
collectives: its own TCP-based ones on CPU, NCCL on GPU) after backward: the update is DDP's.

MindSpore is asynchronous on CPU too: an operator or a compiled step returns once it is queued
(a compiled ResNet-50 step returned after 3.3 s and finished at 7.2 s, issue 42), and
``mindspore.runtime.synchronize`` does nothing on CPU ("CPU device is not supported"), so
``synchronize`` waits on PyNative's executor queue and then reads the step's last outputs.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, MutableMapping
from typing import Any

from ...core.spec import OptimizerSpec, RankSpec
from ...core.workload import BuildContext, Parts, WorkloadError
from .. import (
    Batches,
    DistEnv,
    PhasePlan,
    _loss,
    _optim,
    _roles,
    fresh,
    map_batch,
    require_parameters,
)
from .._loss_scale import POLICY
from .._step import OnRuntime
from . import phases
from .adamw import adamw
from .runtime import MindSporeRuntime

DISTRIBUTION = "mindspore"
RECIPE_FOR = "mindspore"
COMPILER = "mindspore.jit (GRAPH mode)"
INSTALL_HINT = ("MindSpore 2.10 needs numpy<2: create its worker interpreter with "
                "scripts/setup-mindspore (in pytest-dlperf's repository) and run with "
                "--dlperf-python mindspore=$(scripts/setup-mindspore)")

# The scheduler's whole program: MindSpore's init() in the MS_SCHED role serves the cluster's
# registration and heartbeats and returns once every worker has gone; tethered to rank 0
# (``_roles.tethered``: MindSpore's init() holds the GIL, so a thread in it would never run).
SCHEDULER_GRACE_S = 10
SCHEDULER = _roles.tethered("""import mindspore as ms
from mindspore.communication import init
ms.set_device("CPU")
init()
""", SCHEDULER_GRACE_S)


def prepare_environ(environ: MutableMapping[str, str], dist: DistEnv) -> None:
    """What MindSpore's dynamic cluster reads, from the launcher's variables (before MindSpore
    is imported). The scheduler listens on the launcher's spare port on the first node
    (``_roles.spare_port``); its URL takes an address, not a name ("Parse ip failed, url:
    node1:35573" on the Slurm cluster, whose MASTER_ADDR is the first node's name). MindSpore's
    workers retry their registration every 3-5 s by default: 1 s here (a two-rank cluster
    formed in 8-10 s instead of 17-20 s, measured on this 2-core VM)."""
    port = _roles.spare_port(environ, "MindSpore's scheduler")
    environ.update(MS_SCHED_HOST=_roles.ipv4(environ.get("MASTER_ADDR", "127.0.0.1"),
                                             "MindSpore's scheduler"),
                   MS_SCHED_PORT=port,
                   MS_WORKER_NUM=str(dist.world_size), MS_NODE_ID=str(dist.rank),
                   MS_ROLE="MS_WORKER")
    environ.setdefault("MS_RETRY_INTERVAL_LOWER", "1")
    environ.setdefault("MS_RETRY_INTERVAL_UPPER", "1")


def start_scheduler(environ: MutableMapping[str, str]) -> subprocess.Popen[bytes]:
    """The cluster's scheduler, a child of rank 0 (``_roles.start``); it exits by itself once
    every worker has unregistered, or ``SCHEDULER_GRACE_S`` after rank 0 has gone."""
    env = {**environ, "MS_ROLE": "MS_SCHED"}
    env.pop("MS_NODE_ID", None)
    (scheduler,) = _roles.start(SCHEDULER, [env])
    return scheduler


class MindSporeTrainer(OnRuntime):
    """A workload's cell, data, loss and optimizer trained on a rank's ``MindSporeRuntime`` (its
    cluster, device, waits and environment), eagerly or as one ``ms.jit`` step."""

    runtime: MindSporeRuntime

    def __init__(self, spec: RankSpec, dist: DistEnv,
                 recipe: Callable[[BuildContext], Parts]) -> None:
        self.runtime = MindSporeRuntime(spec, dist, prepare_environ, start_scheduler)
        ms = self._ms = self.runtime.ms
        self.world_size = dist.world_size
        ms.set_seed(spec.seed)  # one model on every rank
        parts = recipe(spec.context(dist.rank, dist.world_size, dist.local_rank,
                                    f"cuda:{dist.local_rank}" if self.cuda else "cpu"))
        model = parts.model
        layout = spec.parallel(dist.world_size)
        if not layout.is_data_parallel:
            raise WorkloadError(f"layout {layout.id}: the MindSpore adapter runs data "
                                "parallelism only (its semi-auto parallel modes are not ported "
                                "to --dlperf-layouts)")
        # A Cell is built with training off, and a BatchNorm out of training normalizes by its
        # moving statistics (mean 0, variance 1 at start): ResNet-50's logits reached ~60 and its
        # loss NaN within 3 steps (the NaN issue 42 saw with mindcv's model).
        model.set_train(True)
        self.model = model
        self.params = list(model.trainable_params())
        self.parameters = sum(math.prod(p.shape) for p in self.params)
        require_parameters(self.parameters, recipe)
        ms.set_seed(spec.seed + layout.data_rank(dist.rank))  # each rank's own data
        self.compiled = spec.compiled
        self.amp = spec.precision.enabled
        if self.amp:  # CUDA only (amp_unavailable): fp16 with dynamic loss scaling
            model = ms.amp.auto_mixed_precision(model, "O2", dtype=ms.float16)
        self.loss_scaler = loss_scaler(ms) if spec.precision.loss_scaling else None
        self.optimizer = make_optimizer(ms, self.params, spec.optimizer)
        self.clip_norm = spec.optimizer.clip_norm
        self.criterion = parts.loss or cross_entropy(ms)
        self.reducer = (ms.nn.DistributedGradReducer(self.optimizer.parameters, mean=True,
                                                     degree=dist.world_size)
                        if dist.world_size > 1 else None)
        self.inputs, self.targets = parts.inputs, parts.targets
        self.batches = Batches(parts.data) if parts.data is not None else None
        criterion = self.criterion

        def forward(inputs: Any, targets: Any) -> Any:
            outputs = model(*inputs) if isinstance(inputs, tuple) else model(inputs)
            loss = criterion(outputs, targets)
            if self.loss_scaler is not None:
                loss = self.loss_scaler.scale(loss)
            return loss

        self._grad = ms.value_and_grad(forward, None, self.optimizer.parameters)
        self._step_fn = self._make_step(communicate=True)
        self.train_step = ms.jit(self._step_fn) if self.compiled else self._step_fn
        self._loss: Any = None

    def _make_step(self, communicate: bool) -> Callable[[Any, Any], Any]:
        """The training step as one function (what ``mindspore.jit`` compiles whole):
        forward and backward, the gradients averaged over the ranks (``communicate``), clipped
        by their global norm, the update."""
        grad, update = self._grad, self._update_fn(communicate)

        def train_step(inputs: Any, targets: Any) -> Any:
            loss, grads = grad(inputs, targets)
            return update(loss, grads)

        return train_step

    def _update_fn(self, communicate: bool) -> Callable[[Any, Any], Any]:
        ms, optimizer, clip_norm = self._ms, self.optimizer, self.clip_norm
        if getattr(optimizer, "clip_norm", None) is not None:  # AdamW's compiled update clips
            clip_norm = None
        reducer = self.reducer if communicate else None
        scaler = self.loss_scaler

        def update(loss: Any, grads: Any) -> Any:
            if reducer is not None:
                grads = reducer(grads)
            if scaler is not None:
                loss = scaler.unscale(loss)
                grads = scaler.unscale(grads)
                finite = ms.amp.all_finite(grads)
                scaler.adjust(finite)
                if finite:
                    if clip_norm is not None:
                        grads = ms.ops.clip_by_global_norm(grads, clip_norm)
                    optimizer(grads)
                return loss
            if clip_norm is not None:
                grads = ms.ops.clip_by_global_norm(grads, clip_norm)
            optimizer(grads)
            return loss

        return update

    def _to_device(self, value: Any) -> Any:
        """A batch of the workload's own iterator as MindSpore tensors (numpy arrays taken as
        they are: MindSpore places its tensors itself)."""
        tensor = self._ms.Tensor
        return map_batch(value, lambda v: v if isinstance(v, tensor) or v is None
                         else tensor(v))

    def _next_batch(self) -> tuple[Any, Any]:
        if self.batches is None:
            return fresh(self.inputs), fresh(self.targets)
        inputs, targets = self.batches.next()
        return self._to_device(inputs), self._to_device(targets)

    def step(self) -> None:
        self._loss = self.train_step(*self.step_args(self._next_batch()))

    def step_args(self, batch: tuple[Any, Any]) -> tuple[Any, ...]:
        """The batch as a compiled step takes it: GRAPH mode compiles a tuple argument's
        tensors as constants, so a tuple of new tensors each step (BERT's inputs and targets)
        recompiled the whole step every call (10.9 s a BERT step against 1.9 s); marked
        ``mutable`` they are inputs, compiled once."""
        if not self.compiled:
            return batch
        mutable = self._ms.mutable
        return tuple(mutable(tuple(part)) if isinstance(part, (tuple, list)) else part
                     for part in batch)

    def phase_plan(self) -> PhasePlan:  # the step in phases: phases
        return phases.plan(self)

    @property
    def local_step(self) -> Callable[[], None] | None:
        return self._local_step

    def _local_step(self) -> None:
        """Forward and backward of this rank alone, no all-reduce and no update: the
        straggler check's measure of the rank's own speed (eager, also in a compiled case)."""
        inputs, targets = self._next_batch()
        self._local = self._grad(inputs, targets)

    def synchronize(self) -> None:
        """The runtime's wait (the executor, the device); reading the last step's loss is the
        proof the work is done (``.asnumpy()`` waits for it)."""
        self.runtime.synchronize()
        if self._loss is not None:
            self._loss.asnumpy()

    def loss(self) -> float:
        if self._loss is None:
            return 0.0
        return float(self._loss.asnumpy().astype("float64").mean())

    def environment(self) -> dict[str, Any]:
        env = self.runtime.environment()
        env.update(parameters=self.parameters, compiled=self.compiled)
        return env


def cross_entropy(ms: Any) -> Any:
    """The default loss (``_loss``): MindSpore's ``CrossEntropyLoss``, the mean over the batch
    (and over every token of a language model's ``[B, T, V]`` logits), in the logits' dtype."""
    return _loss.cross_entropy(ms.nn.CrossEntropyLoss())


def loss_scaler(ms: Any) -> Any:
    """MindSpore's dynamic loss scaler, on the one policy (``_loss_scale.POLICY``): its one
    factor, a whole number, multiplies the scale up and divides it down."""
    factor = int(POLICY.growth)
    assert factor == POLICY.growth == 1 / POLICY.backoff, "MindSpore: one whole factor"
    return ms.amp.DynamicLossScaler(POLICY.initial, factor, POLICY.interval)


def make_optimizer(ms: Any, params: list[Any], opt: OptimizerSpec) -> Any:
    """The workload's optimizer (``_optim``: the kind, which parameters decay): SGD with
    momentum and coupled weight decay is ``nn.Momentum`` (the decay added to the gradient before
    the momentum, as torch's SGD). AdamW is torch's (bias-corrected, the decay decoupled),
    MindSpore's own: an ``nn.Optimizer`` compiled whole, clip included, on its fused ``Adam``
    kernel (``adamw``): ``nn.AdamWeightDecay`` has no bias correction, ``mint.optim.AdamW`` has
    no CPU kernel ("Unsupported op [AdamW] on CPU") and ``experimental.optim.AdamW`` refuses to
    run inside a ``mindspore.jit`` step. Each parameter has its decay rate, 0 where the spec
    exempts it."""
    return _optim.build(
        "mindspore", opt,
        sgd=lambda: ms.nn.Momentum(params, learning_rate=opt.lr, momentum=opt.momentum,
                                   weight_decay=opt.weight_decay),
        adamw=lambda: adamw(ms)(
            params, [opt.weight_decay if opt.decays(tuple(p.shape)) else 0.0 for p in params],
            opt.lr, opt.betas, opt.eps, opt.clip_norm))


def amp_unavailable(device_type: str) -> str | None:
    """No AMP case on CPU: MindSpore 2.10 has no CPU bf16 kernels for Conv2D or MatMul (the
    other frameworks' CPU AMP is bf16), and its CPU fp16 would measure another precision
    under the same case id (docs/frameworks.md "MindSpore")."""
    if device_type == "cpu":
        return ("MindSpore 2.10 has no CPU bf16 kernels for Conv2D or MatMul (every other "
                "framework's CPU AMP is bf16); its CPU fp16 would be another precision")
    return None


def compile_unavailable(device_type: str) -> str | None:
    return None  # mindspore.jit compiles on CPU and GPU alike


def eager_unavailable(device_type: str) -> str | None:
    return None  # PyNative mode runs wherever MindSpore does


def build_trainer(spec: RankSpec, dist: DistEnv,
                  recipe: Callable[[BuildContext], Parts] | None) -> MindSporeTrainer:
    if recipe is None:
        raise ValueError("the mindspore adapter needs the workload's mindspore recipe")
    return MindSporeTrainer(spec, dist, recipe)
