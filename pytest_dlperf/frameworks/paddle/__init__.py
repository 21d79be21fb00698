"""PaddlePaddle: a workload's ``paddle.nn.Layer`` under ``paddle.DataParallel``, eager or
``paddle.jit.to_static`` (the ``compiled`` mode: the whole forward as one static program).

Ranks are started by the plugin's launchers (torchrun agents, srun), not by
``paddle.distributed.launch``: ``init_parallel_env`` needs only what every launcher already says
(rank, world size, the first node's address), under Paddle's names, which the adapter sets from
RANK / WORLD_SIZE / MASTER_ADDR before Paddle is imported. Paddle's rank 0 serves its own TCP
store; torchrun's agent store holds ``MASTER_PORT``, so Paddle's goes on the launcher's spare
port on the first node (``DLPERF_FRAMEWORK_PORT``), as OneFlow's control plane does. Gradients cross
ranks through gloo on CPU and NCCL on CUDA; ``DataParallel`` averages them in backward.

Paddle runs eagerly on CPU (a step returns when its kernels are done); on CUDA its kernels are
queued on the stream, and ``synchronize`` waits for the device.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, MutableMapping
from typing import Any

from ...core.parallel import Layout
from ...core.spec import OptimizerSpec, RankSpec
from ...core.strategies import Checked, Unported, register_strategy, why_not
from ...core.workload import BuildContext, Parts, WorkloadError
from .. import Batches, DistEnv, PhasePlan, _optim, fresh, map_batch, require_parameters
from .._loss_scale import POLICY
from .._step import EagerStep, RuntimePeaks
from . import phases
from .runtime import PaddleRuntime

# The CPU wheel and the CUDA one are different distributions; either provides ``paddle``.
DISTRIBUTION = ("paddlepaddle", "paddlepaddle-gpu")
RECIPE_FOR = "paddle"
COMPILER = "paddle.jit.to_static"
INSTALL_HINT = ("PaddlePaddle is not installed: pip install 'pytest-dlperf[paddle]' (the CPU "
                "wheel; on CUDA hosts paddlepaddle-gpu from Paddle's own index)")


def prepare_environ(environ: MutableMapping[str, str], dist: DistEnv, cuda: bool) -> None:
    """What ``paddle.distributed.init_parallel_env`` reads, from the launcher's variables (so:
    before Paddle is imported, and before any Paddle process group exists).

    Paddle's rank 0 serves its TCP store at ``PADDLE_MASTER`` (its C++ side reads that, else the
    first of ``PADDLE_TRAINER_ENDPOINTS``; ``MASTER_ADDR``/``MASTER_PORT`` it reads and leaves
    unused): the first node's address and the launcher's spare port there, since under torchrun
    ``MASTER_PORT`` is the agent's store. Ranks started with no agent and no spare port (srun
    under ``--dlperf-launcher external``) use ``MASTER_PORT``, which nothing else serves then.
    Paddle also insists on every rank's endpoint; with a store they only name the ranks (gloo
    and NCCL pick their own ports through it), so the others are port numbers nothing listens
    on. ``MASTER_PORT`` itself is left as it is: in external mode this is pytest's own process,
    and its other cases read it."""
    port = environ.get("DLPERF_FRAMEWORK_PORT")
    if not port:
        if environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and dist.world_size > 1:
            raise RuntimeError(
                "Paddle's ranks need a free port on the first node for Paddle's own store: "
                "torchrun's agent holds MASTER_PORT and DLPERF_FRAMEWORK_PORT is not set; export "
                "DLPERF_FRAMEWORK_PORT=<a free port on the first node> for every rank")
        port = environ.get("MASTER_PORT", "0")
    host = environ.get("MASTER_ADDR", "127.0.0.1")
    endpoints = [f"{host}:{int(port) + rank}" for rank in range(dist.world_size)]
    environ.update(
        PADDLE_MASTER=endpoints[0],
        PADDLE_TRAINER_ID=str(dist.rank),
        PADDLE_TRAINERS_NUM=str(dist.world_size),
        PADDLE_CURRENT_ENDPOINT=endpoints[dist.rank],
        PADDLE_TRAINER_ENDPOINTS=",".join(endpoints),
        PADDLE_DISTRI_BACKEND="nccl" if cuda else "gloo",
    )
    if cuda:
        environ["FLAGS_selected_gpus"] = str(dist.local_rank)
        # cuDNN's algorithm search for each convolution shape, as torch's cudnn.benchmark: the
        # first steps (the warm-up) pay for it.
        environ.setdefault("FLAGS_cudnn_exhaustive_search", "1")


class PaddleTrainer(RuntimePeaks, EagerStep):
    """A workload's layer, data, loss and optimizer trained on a rank's ``PaddleRuntime`` (its
    device, process group, waits, memory and environment), one ``EagerStep`` at a time."""

    runtime: PaddleRuntime

    def __init__(self, spec: RankSpec, dist: DistEnv,
                 recipe: Callable[[BuildContext], Parts]) -> None:
        self.runtime = PaddleRuntime(spec, dist, prepare_environ)
        paddle = self._paddle = self.runtime.paddle
        self.local_rank = dist.local_rank
        parts = recipe(spec.context(dist.rank, dist.world_size, dist.local_rank,
                                    self.device.replace("gpu", "cuda")))
        model = parts.model
        # BatchNorm's running statistics are parameters with stop_gradient in Paddle.
        self.parameters = sum(math.prod(p.shape) for p in model.parameters()
                              if not p.stop_gradient)
        require_parameters(self.parameters, recipe)
        layout = spec.parallel(dist.world_size)
        self.tensor_parallel = not layout.is_data_parallel
        if self.tensor_parallel:
            model = shard_model(paddle, model, parts, layout, spec)
        self.params = [p for p in model.parameters() if not p.stop_gradient]
        # The ranks of one replica (tensor-parallel) draw the same data.
        paddle.seed(spec.seed + layout.data_rank(dist.rank))
        self.compiled = spec.compiled
        # to_static turns the forward into one static program (Paddle's PIR) the first time it
        # runs, which the warm-up absorbs; backward and the update stay eager, as for torch.
        if self.compiled:
            model = paddle.jit.to_static(model, full_graph=True, backend=None)
        self.model = (paddle.DataParallel(model) if dist.world_size > 1
                      and not self.tensor_parallel else model)
        self.optimizer = make_optimizer(paddle, self.params, spec.optimizer)
        self.criterion = parts.loss or paddle.nn.functional.cross_entropy
        self.inputs, self.targets = parts.inputs, parts.targets
        self.batches = Batches(parts.data) if parts.data is not None else None
        self.amp = spec.precision.enabled
        self.amp_dtype = spec.precision.dtype
        self.scaler = loss_scaler(paddle) if spec.precision.loss_scaling else None
        self._loss: Any = None

    def _next_batch(self) -> tuple[Any, Any]:
        if self.batches is None:
            return fresh(self.inputs), fresh(self.targets)
        inputs, targets = self.batches.next()
        return self._to_device(inputs), self._to_device(targets)

    def _to_device(self, value: Any) -> Any:
        """A batch from the workload's iterator on this rank's device (a DataLoader's tensors
        are on the CPU), inside the timed step."""
        if not self.cuda:
            return value
        tensor = self._paddle.Tensor
        return map_batch(value, lambda v: v.cuda(self.local_rank, blocking=False)
                         if isinstance(v, tensor) else v)

    def _autocast(self) -> Any:
        if not self.amp:
            return contextlib.nullcontext()
        return self._paddle.amp.auto_cast(enable=True, dtype=self.amp_dtype, level="O1")

    def _forward(self, inputs: Any, targets: Any) -> Any:
        with self._autocast():
            outputs = self.model(*inputs) if isinstance(inputs, tuple) else self.model(inputs)
            self._loss = self.criterion(outputs, targets)
            return self._loss

    def _backward(self, loss: Any) -> None:
        # DataParallel all-reduces (averages) the gradients here, unless in no_sync.
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def _update(self) -> None:
        if self.scaler is not None:
            # Unscales, skips the step on an inf or NaN, and clips (the optimizer's grad_clip)
            # the unscaled gradients.
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.clear_grad(set_to_zero=False)

    def phase_plan(self) -> PhasePlan:
        """The step in phases (``phases``)."""
        return phases.plan(self)

    @property
    def local_step(self) -> Callable[[], None] | None:
        return self._local_step

    def _local_step(self) -> None:
        """Forward and backward on this rank alone, no all-reduce (DataParallel's ``no_sync``)
        and no update: the straggler check's measure of the rank's own speed."""
        no_sync = getattr(self.model, "no_sync", None)
        with no_sync() if no_sync is not None else contextlib.nullcontext():
            self._forward(*self._next_batch()).backward()
        self.optimizer.clear_grad(set_to_zero=False)

    def loss(self) -> float:
        if self._loss is None:
            return 0.0
        loss = self._loss._local_value() if self._loss.is_dist() else self._loss
        return float(loss.astype("float32").item())

    def environment(self) -> dict[str, Any]:
        env = self.runtime.environment()
        env.update(parameters=self.parameters, compiled=self.compiled)
        if self.tensor_parallel:
            env["data_parallel_ranks"] = 1
        return env


def shard_model(paddle: Any, model: Any, parts: Parts, layout: Layout, spec: RankSpec) -> Any:
    """Tensor parallelism through Paddle's auto-parallel API (``fleet``'s hybrid parallelism
    does not run on CPU: its strategies below). ``Parts.plans['tp']`` maps sublayer names to
    ``"colwise"`` / ``"rowwise"`` (torch's words: one plan reads the same in both recipes) or
    to ``{parameter name: dist placement}``. Paddle keeps a Linear's weight ``[in, out]``, so
    column-parallel is ``Shard(1)`` with the bias ``Shard(0)``; row-parallel ``Shard(0)`` with
    the bias replicated; parameters the plan leaves out are replicated (``shard_layer``), and
    Paddle inserts the collectives from the placements. On CPU only plans whose collectives
    are all-reduces run (Megatron's column-then-row pairs): a split output consumed whole
    needs a reduce-scatter in backward, which has no CPU kernel."""
    why = why_not("paddle", layout.kinds, spec.device_type, spec.compiled)
    if why or layout.tp != layout.world_size:
        raise WorkloadError(why or f"layout {layout.id}: the paddle adapter runs tensor "
                            "parallelism over every rank (no data-parallel dimension beside it)")
    dist = paddle.distributed
    styles = {"colwise": {"weight": dist.Shard(1), "bias": dist.Shard(0)},
              "rowwise": {"weight": dist.Shard(0), "bias": dist.Replicate()}}
    plan = dict(parts.plan("tp") or {})
    unknown = sorted(set(plan) - {name for name, _ in model.named_sublayers()})
    if unknown:
        raise WorkloadError(f"Parts.plans['tp'] names no sublayer {', '.join(unknown)} of the model")

    def shard(name: str, layer: Any, mesh: Any) -> None:
        style = plan.get(name)
        placements = styles[style] if isinstance(style, str) and style in styles else style
        for key, placement in dict(placements or {}).items():
            if getattr(layer, key, None) is not None:
                layer._parameters[key] = dist.shard_tensor(getattr(layer, key), mesh,
                                                           [placement])

    return dist.shard_layer(model, dist.ProcessMesh(list(range(layout.world_size))), shard)


def tp_unavailable(kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
    """What Paddle 3.3.1 ran on CPU (measured 2026-11-25): tensor parallelism through the
    auto-parallel API, eagerly; on CUDA the layouts are fleet's hybrid parallelism, not
    ported."""
    if device_type != "cpu":
        return ("not ported: on CUDA Paddle's layouts are fleet's hybrid parallelism, which "
                "the adapter does not set up (it ran the auto-parallel API on CPU only)")
    if compiled:
        return ("to_static of a model of dist tensors (the auto-parallel API) aborted its "
                "ranks on CPU: 'terminate called after throwing std::exception'")
    return None


# Paddle's strategy: tensor parallelism through the auto-parallel API (``shard_tp``). Its
# pipeline and sharding refuse the CPU, measured with Paddle 3.3.1 on 2026-11-25: fleet's
# hybrid parallelism says "Only support xpu, gpu and custom_device".
register_strategy("paddle", Checked("tp", tp_unavailable))
register_strategy("paddle", Unported(
    "pp", "Paddle's pipeline (fleet PipelineLayer) needs send/recv, and gloo 'does not support "
          "send with sync_op and use_calc_stream' on CPU"))
# Row-split tables (auto-parallel Shard(0) on an Embedding's weight), measured 2026-11-29 on
# two gloo ranks: they train as one process only when every rank takes the whole batch; with
# the batch split over the ranks, as the emb layouts train, backward needs a reduce-scatter.
register_strategy("paddle", Unported(
    "emb", "Paddle's row-split embedding (auto-parallel Shard(0) on its weight) with the batch "
           "split over the ranks reduce-scatters in backward, and its CPU kernel is missing: "
           "'Unimplemented cpu kernel for CReduceScatterOp'"))
register_strategy("paddle", Unported(
    "fsdp", "Paddle's sharding (auto-parallel ShardingStage3) reduce-scatters the gradients, and "
            "its CPU kernel is missing: 'Unimplemented cpu kernel for CReduceScatterOp'"))


def loss_scaler(paddle: Any) -> Any:
    """Paddle's dynamic loss scaler, on the one policy (``_loss_scale.POLICY``)."""
    return paddle.amp.GradScaler(init_loss_scaling=POLICY.initial, incr_ratio=POLICY.growth,
                                 decr_ratio=POLICY.backoff, incr_every_n_steps=POLICY.interval,
                                 decr_every_n_nan_or_inf=1)


def make_optimizer(paddle: Any, params: list[Any], opt: OptimizerSpec) -> Any:
    """The workload's optimizer (``_optim``: the kind, which parameters decay). Momentum with a
    float ``weight_decay`` is coupled L2 decay (the decay term added to the gradient before the
    momentum, as torch's SGD); AdamW's decay is decoupled, kept off the parameters the workload
    excludes by Paddle's parameter names. Paddle's own: the global-norm clip is the
    optimizer's, over every parameter at once (the loss scaler clips after unscaling)."""
    clip = (paddle.nn.ClipGradByGlobalNorm(opt.clip_norm) if opt.clip_norm is not None
            else None)

    def adamw() -> Any:
        decayed = {p.name for p in _optim.decay_split(params, opt)[0]}
        return paddle.optimizer.AdamW(learning_rate=opt.lr, beta1=opt.betas[0],
                                      beta2=opt.betas[1], epsilon=opt.eps, parameters=params,
                                      weight_decay=opt.weight_decay, grad_clip=clip,
                                      apply_decay_param_fun=lambda name: name in decayed)

    return _optim.build(
        "paddle", opt, adamw=adamw,
        sgd=lambda: paddle.optimizer.Momentum(
            learning_rate=opt.lr, momentum=opt.momentum, parameters=params,
            weight_decay=opt.weight_decay or None, grad_clip=clip))


def amp_unavailable(device_type: str) -> str | None:
    """Paddle's AMP is CUDA's (and XPU's): ``auto_cast`` on CPU leaves every op in fp32 with a
    warning ("only support CUDAPlace, XPUPlace..."), and pure bf16 fails on CPU (conv2d has no
    bf16 CPU kernel). Measuring that as "amp" would be a lie."""
    if device_type == "cpu":
        return ("Paddle has no CPU mixed precision (auto_cast on CPU runs fp32 with a warning; "
                "pure bf16 has no CPU conv2d kernel)")
    return None


def compile_unavailable(device_type: str) -> str | None:
    return None  # to_static runs on CPU and CUDA alike


def eager_unavailable(device_type: str) -> str | None:
    return None  # dygraph runs wherever Paddle does


def build_trainer(spec: RankSpec, dist: DistEnv,
                  recipe: Callable[[BuildContext], Parts] | None) -> PaddleTrainer:
    if recipe is None:
        raise ValueError("the paddle adapter needs the workload's paddle recipe")
    return PaddleTrainer(spec, dist, recipe)
