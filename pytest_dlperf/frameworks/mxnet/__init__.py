"""MXNet (Apache MXNet 1.9.1, retired upstream: its last release, of May 2022): a workload's
Gluon ``HybridBlock`` trained by ``autograd`` and a ``gluon.Trainer``, op by op (``eager``) or
hybridized into one static graph per forward and backward (``compiled``:
``hybridize(static_alloc=True, static_shape=True)``, what gluon-cv's and gluon-nlp's training
scripts ran).

MXNet 1.9.1 needs numpy < 1.24, so its ranks run under their own interpreter
(``--dlperf-python mxnet=PATH``; ``scripts/setup-mxnet`` makes one). Data parallelism is MXNet's
own distributed key-value store (``kvstore="dist_sync"``, ps-lite): a scheduler, which only
registers the nodes, and one server, which sums each gradient pushed by every worker and hands
the sum back, started by rank 0 on the first node at the launcher's spare port
(``DLPERF_FRAMEWORK_PORT``) as the wheel's ``dmlc_tracker`` would start them. Every rank is a
worker whose roles come from environment variables (``DMLC_ROLE``, ``DMLC_PS_ROOT_URI``,
``DMLC_PS_ROOT_PORT``, ``DMLC_NUM_SERVER``, ``DMLC_NUM_WORKER``, ``DMLC_NODE_HOST``), set here
from the launcher's RANK / WORLD_SIZE / MASTER_ADDR before MXNet is imported: the plugin's
launchers (local nodes, Slurm, external) start them, not ``dmlc_tracker`` (which calls
``Thread.isAlive``, gone since Python 3.9). Horovod, DLPerf's other MXNet path, builds from
source only (~4 min here, with MPI or Gloo): not a dependency a CI should take. The gradients
are summed by the store (a push and a pull of each, ``KVStore.pushpull``), clipped as their
mean and applied on every worker by ``Trainer.update(world_size)`` (rescaled by 1 / world size):
each rank's loss is its batch's mean, so the update is DDP's (the mean gradient), and every
worker holds the same weights (the optimizer runs on the workers, as DDP's does, not on the
server).

The ``pfc`` layout kind (a classifier's head split by class, eager) is a part strategy
(``classes``), applied after the recipe: the parameters it holds per rank are neither
broadcast nor summed through the store.

MXNet is asynchronous on CPU too: ``step`` hands the work to its engine and returns (a step
handed off in 0.03 s finished at 0.34 s, issue 43), so ``synchronize`` waits with
``mx.nd.waitall()``.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, MutableMapping
from typing import Any

from ...core.spec import OptimizerSpec, RankSpec
from ...core.strategies import apply_part_strategies, why_not
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
from .._step import EagerStep
from . import (
    classes,  # noqa: F401  (registers MXNet's pfc strategy)
    phases,
)
from .runtime import MXNetPart, MXNetRuntime

DISTRIBUTION = ("mxnet", "mxnet-cu112", "mxnet-cu117", "mxnet-mkl")
RECIPE_FOR = "mxnet"
COMPILER = "HybridBlock.hybridize (static_alloc, static_shape)"
INSTALL_HINT = ("MXNet 1.9.1 needs numpy<1.24: create its worker interpreter with "
                "scripts/setup-mxnet (in pytest-dlperf's repository) and run with "
                "--dlperf-python mxnet=$(scripts/setup-mxnet)")

# The scheduler's and the server's whole program: importing MXNet in the DMLC_ROLE "scheduler"
# or "server" runs that role until every worker has finalized, then exits; tethered to rank 0
# (``_roles.tethered``: a killed worker leaves the others and these roles waiting forever).
ROLE_GRACE_S = 10
ROLE = _roles.tethered("import mxnet\n", ROLE_GRACE_S)


def prepare_environ(environ: MutableMapping[str, str], dist: DistEnv) -> None:
    """What MXNet's distributed key-value store reads, from the launcher's variables (before
    MXNet is imported). The scheduler listens on the launcher's spare port on the first node
    (``_roles.spare_port``), at MASTER_ADDR as an address (a Slurm cluster's is the first node's
    name). ``PORT`` is removed: ps-lite binds every node to it when set (a shell's PORT made
    each node take the scheduler's port here, and a worker aborted on "Check failed:
    is_scheduler_")."""
    port = _roles.spare_port(environ, "MXNet's scheduler")
    root = _roles.ipv4(environ.get("MASTER_ADDR", "127.0.0.1"), "MXNet's scheduler")
    environ.pop("PORT", None)
    environ.update(DMLC_ROLE="worker", DMLC_PS_ROOT_URI=root, DMLC_PS_ROOT_PORT=port,
                   DMLC_NUM_SERVER="1", DMLC_NUM_WORKER=str(dist.world_size),
                   DMLC_NODE_HOST=_roles.own_address(root, int(port)))


def start_roles(environ: MutableMapping[str, str]) -> list[subprocess.Popen[bytes]]:
    """The store's scheduler and its server, children of rank 0 (``_roles.start``); they exit
    by themselves once every worker has finalized, or ``ROLE_GRACE_S`` after rank 0 has gone."""
    return _roles.start(ROLE, [{**environ, "DMLC_ROLE": role} for role in ("scheduler",
                                                                          "server")])


class MXNetTrainer(EagerStep):
    """A workload's block, data, loss and optimizer trained on a rank's ``MXNetRuntime`` (its
    store job, device, store, waits and environment), one ``EagerStep`` at a time."""

    runtime: MXNetRuntime

    def __init__(self, spec: RankSpec, dist: DistEnv,
                 recipe: Callable[[BuildContext], Parts]) -> None:
        self.runtime = MXNetRuntime(spec, dist, prepare_environ, start_roles)
        mx = self._mx = self.runtime.mx
        self.world_size = dist.world_size
        self.context = self.runtime.context
        layout = spec.parallel(dist.world_size)
        why = None if layout.is_data_parallel else why_not("mxnet", layout.kinds,
                                                          spec.device_type, spec.compiled)
        if why:
            raise WorkloadError(f"layout {layout.id}: {why}")
        self.amp = spec.precision.enabled
        if self.amp:  # before the model is built: AMP casts the operators it creates
            from mxnet.contrib import amp

            amp.init(target_dtype="float16" if self.cuda else "bfloat16")
        mx.random.seed(spec.seed)  # one model on every rank (and the store starts from rank 0's)
        parts = recipe(spec.context(dist.rank, dist.world_size, dist.local_rank,
                                    f"cuda:{dist.local_rank}" if self.cuda else "cpu"))
        self.model = parts.model
        trained = [p for p in self.model.collect_params().values() if p.grad_req != "null"]
        self.parameters = sum(math.prod(p.shape) for p in trained)
        require_parameters(self.parameters, recipe)
        self.kvstore = self.runtime.store()
        # A strategy's (pfc's class-split head) rows are each rank's own: only the rest is
        # broadcast from rank 0 and summed through the store (``self.params``).
        part = apply_part_strategies("mxnet", MXNetPart(
            module=self.model, parts=parts, layout=layout, spec=spec, mx=mx, rank=dist.rank,
            context=self.context, store=self.kvstore))
        self.sharded, self.layout_id = part.notes, layout.id
        held = {id(p) for p in part.held}
        self.params = [p for p in self.model.collect_params().values()
                       if p.grad_req != "null" and id(p) not in held]
        mx.random.seed(spec.seed + layout.data_rank(dist.rank))  # each rank's own data
        self.compiled = spec.compiled
        if self.compiled:
            self.model.hybridize(static_alloc=True, static_shape=True)
        self.grad_keys = self._share_start(self.kvstore) if self.kvstore is not None else []
        self.clip_norm = spec.optimizer.clip_norm
        self.trainer = mx.gluon.Trainer(self.params + part.held,
                                        make_optimizer(mx, self.params + part.held,
                                                       spec.optimizer), kvstore=None)
        self.loss_scaling = spec.precision.loss_scaling
        if self.loss_scaling:
            init_loss_scaling(self.trainer)
        self.criterion = parts.loss or cross_entropy(mx)
        self.inputs, self.targets = parts.inputs, parts.targets
        self.batches = Batches(parts.data) if parts.data is not None else None
        self.communicating = True
        self._loss: Any = None

    def _share_start(self, kvstore: Any) -> list[int]:
        """Rank 0's parameters on every rank (as DDP broadcasts them), under keys 0..n-1 of the
        store, and keys n..2n-1 for the gradients, starting at zero; the keys the gradients
        go by. Not ``gluon.Trainer``'s own store handling: with the optimizer on the workers
        it pulls the starting parameters and pushes the first gradients under the same keys,
        which nothing orders (different arrays), and one rank of two now and then got the
        summed gradients as its starting bias (in 4 of 9 two-rank runs here)."""
        nd, count = self._mx.nd, len(self.params)
        data = [p.data(self.context) for p in self.params]
        kvstore.broadcast(list(range(count)), data, out=data)
        keys = list(range(count, 2 * count))
        kvstore.init(keys, [nd.zeros(p.shape, ctx=self.context, dtype=p.dtype)
                            for p in self.params])
        nd.waitall()  # the starting parameters in before any gradient goes out
        return keys

    def _to_device(self, value: Any) -> Any:
        """A batch of the workload's own iterator as NDArrays on this rank's device."""
        nd = self._mx.nd
        return map_batch(value, lambda v: v if v is None
                         else (v.as_in_context(self.context) if isinstance(v, nd.NDArray)
                               else nd.array(v, ctx=self.context)))

    def _next_batch(self) -> tuple[Any, Any]:
        if self.batches is None:
            return fresh(self.inputs), fresh(self.targets)
        inputs, targets = self.batches.next()
        return self._to_device(inputs), self._to_device(targets)

    def _forward(self, inputs: Any, targets: Any) -> Any:
        """The loss, recorded for backward."""
        with self._mx.autograd.record():
            outputs = self.model(*inputs) if isinstance(inputs, tuple) else self.model(inputs)
            loss = self._loss = self.criterion(outputs, targets)
            if self.loss_scaling:  # the scaled loss to backward; the loss itself reported
                from mxnet.contrib import amp

                with amp.scale_loss(loss, self.trainer) as scaled:
                    return scaled
            return loss

    def _backward(self, loss: Any) -> None:
        loss.backward()

    def _update(self) -> None:
        """The gradients summed over the workers (the store), clipped as their mean, applied
        rescaled by 1 / world size: the mean gradient, DDP's update."""
        if self.kvstore is not None and self.communicating:
            # Last parameters first, as backward produces their gradients.
            for index in reversed(range(len(self.params))):
                grad = self.params[index].grad(self.context)
                self.kvstore.pushpull(self.grad_keys[index], grad, out=grad, priority=-index)
        if self.clip_norm is not None:  # the sum at world x clip_norm: the mean at clip_norm
            clip_global_norm(self._mx.nd, [p.grad(self.context) for p in self.params],
                             self.clip_norm * self.world_size)
        self.trainer.update(self.world_size)

    def phase_plan(self) -> PhasePlan:  # the step in phases: phases
        return phases.plan(self)

    @property
    def local_step(self) -> Callable[[], None] | None:
        return self._local_step

    def _local_step(self) -> None:
        """Forward and backward of this rank alone, no all-reduce and no update: the
        straggler check's measure of the rank's own speed."""
        self._backward(self._forward(*self._next_batch()))

    def loss(self) -> float:
        if self._loss is None:
            return 0.0
        return float(self._loss.astype("float64").mean().asscalar())

    def environment(self) -> dict[str, Any]:
        env = self.runtime.environment()
        env.update(parameters=self.parameters, compiled=self.compiled)
        if self.sharded:
            env.update(layout=self.layout_id, sharded_modules=self.sharded)
        return env


def cross_entropy(mx: Any) -> Callable[[Any, Any], Any]:
    """The default loss (``_loss``): Gluon's softmax cross-entropy, the mean over the batch
    (and over every token of a language model's ``[B, T, V]`` logits), in fp32 (AMP's bf16
    logits cast up, as torch's autocast runs cross-entropy in fp32)."""
    loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    return _loss.cross_entropy(lambda logits, labels: loss(logits, labels).mean(),
                               fp32=lambda logits: logits.astype("float32", copy=False))


def clip_global_norm(nd: Any, grads: list[Any], max_norm: float) -> None:
    """torch's ``clip_grad_norm_``: every gradient scaled by ``max_norm / (norm + 1e-6)`` where
    the norm of all of them together is above ``max_norm``; in place, on the device, nothing
    read back (no synchronization). Each square sum a dot product (BLAS): Gluon's
    ``clip_global_norm`` takes ``nd.norm``, 0.09 s for BERT-base's 30522 x 768 gradient here
    against 0.01 s, and reads the norm back unless told not to."""
    squares = [nd.dot(g.reshape((-1,)), g.reshape((-1,))) for g in grads]
    total = nd.sqrt(nd.add_n(*squares) if len(squares) > 1 else squares[0])
    scale = nd.minimum(max_norm / (total + 1e-6), 1.0)
    for grad in grads:
        nd.broadcast_mul(grad, scale, out=grad)


def init_loss_scaling(trainer: Any) -> Any:
    """MXNet AMP's dynamic loss scale on ``trainer`` (``amp.init`` first), on the one policy
    (``_loss_scale.POLICY``). MXNet 1.9.1 takes no arguments for it: its scaler's start and
    interval are set on it; its factor is 2, up and down."""
    from mxnet.contrib import amp

    assert (POLICY.growth, POLICY.backoff) == (2.0, 0.5), "MXNet scales by 2, up and down"
    amp.init_trainer(trainer)
    scaler = trainer._amp_loss_scaler
    scaler._loss_scale = scaler._next_loss_scale = POLICY.initial
    scaler._scale_seq_len = POLICY.interval
    return scaler


def make_optimizer(mx: Any, params: list[Any], opt: OptimizerSpec) -> Any:
    """The workload's optimizer (``_optim``: the kind, which parameters decay). SGD with
    momentum and coupled weight decay is MXNet's ``sgd`` (its momentum buffer is torch's times
    -lr, the same update at a fixed rate). AdamW is torch's on MXNet's fused Adam kernel
    (``adamw``): MXNet 1.9 registers no AdamW, and its ``contrib.adamw_update`` kernel has no
    bias correction and scales the decay by ``eta``, not the rate. MXNet's own: a parameter
    exempt from decay is told so on the parameter (``wd_mult`` 0), for either kind."""
    for p in params:
        p.wd_mult = 1.0 if opt.decays(p.shape) else 0.0

    def adamw() -> Any:
        from .adamw import adamw

        return adamw(mx)(learning_rate=opt.lr, betas=opt.betas, epsilon=opt.eps,
                         wd=opt.weight_decay)

    return _optim.build(
        "mxnet", opt, adamw=adamw,
        sgd=lambda: mx.optimizer.SGD(learning_rate=opt.lr, momentum=opt.momentum,
                                     wd=opt.weight_decay))


def amp_unavailable(device_type: str) -> str | None:
    """bf16 on CPU (mxnet.contrib.amp), fp16 with a dynamic loss scale on CUDA. MXNet 1.9.1's
    oneDNN has bf16 kernels for AVX-512 CPUs only: on an AVX2 CPU (an AMD EPYC VM here,
    2026-11-27) every bf16 FullyConnected failed with "could not create a primitive descriptor
    iterator" (mkldnn_fully_connected.cc:71)."""
    if device_type == "cpu":
        return cpu_bf16_unavailable(cpu_flags())
    return None


_AVX512_CORE = ("avx512f", "avx512bw", "avx512vl", "avx512dq")


def cpu_bf16_unavailable(flags: set[str]) -> str | None:
    """Why MXNet's oneDNN has no bf16 kernel on a CPU with these ``/proc/cpuinfo`` flags, or
    None (oneDNN's bf16 needs AVX-512 core: avx512f, bw, vl and dq)."""
    missing = [flag for flag in _AVX512_CORE if flag not in flags]
    if missing:
        return ("MXNet 1.9.1's oneDNN has bf16 kernels for AVX-512 CPUs only, and this CPU lacks "
                f"{', '.join(missing)}: its bf16 layers fail ('could not create a primitive "
                "descriptor iterator')")
    return None


def cpu_flags() -> set[str]:
    """This host's CPU flags (``/proc/cpuinfo``); all of them, where it cannot be read (a
    non-Linux host: MXNet tells for itself)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set(_AVX512_CORE)


def compile_unavailable(device_type: str) -> str | None:
    return None  # hybridize compiles on CPU and GPU alike


def eager_unavailable(device_type: str) -> str | None:
    return None  # imperative Gluon runs wherever MXNet does


def build_trainer(spec: RankSpec, dist: DistEnv,
                  recipe: Callable[[BuildContext], Parts] | None) -> MXNetTrainer:
    if recipe is None:
        raise ValueError("the mxnet adapter needs the workload's mxnet recipe")
    return MXNetTrainer(spec, dist, recipe)
