"""OneFlow: a workload's ``nn.Module``, eager under DistributedDataParallel or a static
``nn.Graph`` with the optimizer inside (the ``compiled`` mode: what DLPerf measured).

OneFlow 0.9.0, the last PyPI release, runs on Python <= 3.10 only, so its ranks usually run
under their own interpreter (``--dlperf-python oneflow=PATH``; ``scripts/setup-oneflow`` makes
one). They are still started by the torchrun agents: OneFlow reads the same MASTER_ADDR /
MASTER_PORT / WORLD_SIZE / RANK / LOCAL_RANK variables that its own
``oneflow.distributed.launch`` sets, and reads them once, when it is imported. Its rank 0 listens
on MASTER_PORT, which torchrun's agent store already holds, so the launcher hands every rank a
second free port on the first node (``DLPERF_FRAMEWORK_PORT``) to use instead.

OneFlow is asynchronous even on CPU: a step returns once its work is queued on OneFlow's virtual
machine (8 ms/step to dispatch vs 158 ms/step to run, ResNet-50 32x32 batch 2, measured here), so
``synchronize`` waits for the virtual machine at every window boundary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ...core.spec import RankSpec
from ...core.strategies import Checked, register_strategy, why_not
from ...core.workload import BuildContext, Parts, WorkloadError
from .. import Batches, DistEnv, PhasePlan, map_batch, require_parameters
from .._step import OnRuntime

# imported for what they register: classes and embedding register OneFlow's pfc and emb strategies
from . import classes, embedding, phases  # noqa: F401
from .parallel import Sharding
from .runtime import OneFlowRuntime
from .update import EagerLossScaler, graph_loss_scaler, make_optimizer

DISTRIBUTION = "oneflow"
INSTALL_HINT = ("OneFlow 0.9.0 needs Python 3.10: create its worker interpreter with "
                "scripts/setup-oneflow (in pytest-dlperf's repository) and run with "
                "--dlperf-python oneflow=$(scripts/setup-oneflow)")

RECIPE_FOR = "oneflow"
COMPILER = "nn.Graph"


class OneFlowTrainer(OnRuntime):
    """A workload's module, data, loss and optimizer trained on a rank's ``OneFlowRuntime`` (its
    device, waits and environment), eagerly or as one ``nn.Graph``, data parallel or sharded."""

    runtime: OneFlowRuntime

    def __init__(self, spec: RankSpec, dist: DistEnv,
                 recipe: Callable[[BuildContext], Parts]) -> None:
        self.runtime = OneFlowRuntime(spec, dist)
        flow = self._flow = self.runtime.flow
        local_rank = self.runtime.local_rank
        self._recipe = recipe
        self._context = spec.context(dist.rank, dist.world_size, dist.local_rank,
                                     f"cuda:{local_rank}" if self.cuda else "cpu")
        self._local: Any = None  # the straggler check's own copy of the model
        parts = recipe(self._context)
        model = parts.model
        self.parameters = sum(p.numel() for p in model.parameters())
        require_parameters(sum(p.numel() for p in model.parameters() if p.requires_grad), recipe)
        # The ranks of one replica (tensor- and pipeline-parallel) draw the same data.
        layout = spec.parallel(dist.world_size)
        flow.manual_seed(spec.seed + layout.data_rank(dist.rank))
        self.graph = spec.compiled
        self.amp = spec.precision.enabled
        # fp16 needs loss scaling; bf16 (the CPU's AMP) has fp32's exponent range.
        self.amp_dtype = getattr(flow, spec.precision.dtype)
        opt = spec.optimizer

        why = (None if layout.is_data_parallel else
               why_not("oneflow", layout.kinds, spec.device_type, self.graph))
        if why:
            raise WorkloadError(f"layout {layout.id}: {why}")
        self.sharding = None if layout.is_data_parallel else Sharding(flow, layout, parts,
                                                                      spec.device_type)
        self.target_placement = self.placement = None
        self.sharded: dict[str, Any] = {}  # what a registered kind's strategy sharded, by kind
        if self.sharding is not None:
            model = self.sharding.place(model)
            self.sharded = self.sharding.apply_strategies(model, parts, spec)
            self.placement, self.target_placement = self.sharding.stages[0], self.sharding.stages[-1]
        elif self.graph and dist.world_size > 1:
            # nn.Graph is data-parallel through global tensors: parameters broadcast, the batch
            # split along dim 0 (each rank's own per-device batch); OneFlow inserts the
            # gradient all-reduce itself.
            self.placement = flow.placement("cuda" if self.cuda else "cpu",
                                            ranks=list(range(dist.world_size)))
            self.target_placement = self.placement
            model = model.to_global(placement=self.placement, sbp=flow.sbp.broadcast)
        else:
            model = model.to(self.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(flow, self.params, opt, graph=self.graph)
        self.clip_norm = opt.clip_norm
        self.criterion = parts.loss or flow.nn.CrossEntropyLoss()
        # Synthetic data resident on the device, as DLPerf's synthetic-data runs; or the
        # workload's own iterator, moved batch by batch inside the timed step.
        self.inputs = self._place(parts.inputs)
        self.targets = self._place(parts.targets, self.target_placement)
        self.batches = Batches(parts.data) if parts.data is not None else None
        # OneFlow 0.9.0's GradScaler configures nn.Graph only; eager steps get their own.
        self.scaler = (graph_loss_scaler(flow)
                       if spec.precision.loss_scaling and self.graph else None)
        self.eager_scaler = (EagerLossScaler(flow)
                             if spec.precision.loss_scaling and not self.graph else None)

        if self.graph:
            self.train_step = self._graph_step(model)
        else:
            if dist.world_size > 1 and self.sharding is None:
                model = flow.nn.parallel.DistributedDataParallel(model)
            self.model = model
            self.train_step = self._eager_step
        self._loss = None

    def _place(self, value: Any, placement: Any = None) -> Any:
        """On this rank's device (a callable is placed as it is called), then global for a
        data-parallel graph or a layout (targets on the last pipeline stage)."""
        return map_batch(value, lambda v: v if callable(v) or v is None
                         else self._batch(v.to(self.device), placement or self.placement))

    def _next_batch(self) -> tuple[Any, Any]:
        if self.batches is None:
            inputs, targets = self.inputs, self.targets
            # Fresh values each step are drawn locally, then placed like the resident ones.
            return (self._place(inputs()) if callable(inputs) else inputs,
                    self._place(targets(), self.target_placement) if callable(targets)
                    else targets)
        inputs, targets = self.batches.next()
        return self._place(inputs), self._place(targets, self.target_placement)

    def _batch(self, local: Any, placement: Any) -> Any:
        if placement is None:
            return local
        sbp = (self._flow.sbp.split(0) if self.sharding is None
               else self.sharding.sbp(None, data=True))
        return local.to_global(placement=placement, sbp=sbp)

    def _graph_step(self, model: Any) -> Any:
        flow, trainer = self._flow, self

        class TrainGraph(flow.nn.Graph):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                super().__init__()
                self.model = model
                self.criterion = trainer.criterion
                self.add_optimizer(trainer.optimizer)
                if trainer.amp:
                    self.config.enable_amp(True, dtype=trainer.amp_dtype)
                if trainer.scaler is not None:
                    self.set_grad_scaler(trainer.scaler)
                if trainer.sharding is not None:
                    trainer.sharding.configure(self)

            def build(self, inputs: Any, targets: Any) -> Any:
                outputs = (self.model(*inputs) if isinstance(inputs, tuple)
                           else self.model(inputs))
                loss = self.criterion(outputs, targets)
                loss.backward()
                if trainer.sharding is None:
                    return loss
                return loss.to_global(placement=trainer.sharding.everyone,
                                      sbp=flow.sbp.broadcast)

        return TrainGraph()

    def _eager_step(self, inputs: Any, targets: Any) -> Any:
        loss = self._forward(inputs, targets)
        self._update(self._backward(loss))
        return loss

    def _autocast(self) -> Any:
        # Not even a disabled autocast on CPU: OneFlow warns about it at every step.
        return (self._flow.autocast(self.device.type, dtype=self.amp_dtype) if self.amp
                else contextlib.nullcontext())

    def _forward(self, inputs: Any, targets: Any) -> Any:
        self.optimizer.zero_grad()
        with self._autocast():
            outputs = (self.model(*inputs) if isinstance(inputs, tuple)
                       else self.model(inputs))
            return self.criterion(outputs, targets)

    def _backward(self, loss: Any) -> bool:
        """Backward (DDP all-reduces in its hooks); whether the gradients are all finite."""
        if self.eager_scaler is None:
            loss.backward()
            return True
        self.eager_scaler.backward(loss)
        return self.eager_scaler.unscale(self.params)

    def _update(self, finite: bool) -> None:
        if self.clip_norm is not None:  # on the all-reduced gradients (DDP's backward)
            self._flow.nn.utils.clip_grad_norm_(self.params, self.clip_norm)
        if finite:
            self.optimizer.step()

    def step(self) -> None:
        self._loss = self.train_step(*self._next_batch())

    def phase_plan(self) -> PhasePlan:  # the step in phases: phases
        return phases.plan(self)

    def _on_device(self, value: Any) -> Any:
        """On this rank's device, local (a callable is placed as it is called)."""
        return map_batch(value, lambda v: v if callable(v) or v is None else v.to(self.device))

    @property
    def local_step(self) -> Callable[[], None] | None:
        return self._local_step

    def _local_step(self) -> None:
        """Forward and backward of this rank alone, for the straggler check (docs/resources.md
        "Stragglers"). OneFlow's DDP all-reduces in hooks on every backward and a graph's
        parameters are global, so this runs a plain local copy of the model, built from the
        recipe on the first call (outside any timed window)."""
        if self._local is None:
            parts = self._recipe(self._context)
            model = parts.model.to(self.device)
            inputs, targets = parts.inputs, parts.targets
            if parts.data is not None:
                inputs, targets = next(iter(parts.data))
            self._local = (model, self._on_device(inputs), self._on_device(targets),
                           parts.loss or self.criterion)
        model, inputs, targets, criterion = self._local
        inputs = self._on_device(inputs()) if callable(inputs) else inputs
        targets = self._on_device(targets()) if callable(targets) else targets
        with self._autocast():
            outputs = model(*inputs) if isinstance(inputs, tuple) else model(inputs)
            loss = criterion(outputs, targets)
        loss.backward()
        for param in model.parameters():
            param.grad = None

    def loss(self) -> float:
        if self._loss is None:
            return 0.0
        loss = self._loss
        if self.placement is not None:  # a batch split over the ranks leaves partial sums
            loss = loss.to_global(placement=loss.placement,
                                  sbp=self._flow.sbp.broadcast).to_local()
        return float(loss.float().mean().item())  # a pipeline's: one per micro-batch

    def environment(self) -> dict[str, Any]:
        env = self.runtime.environment()
        env.update(parameters=self.parameters, compiled=self.graph)
        if self.sharding is not None:
            env["data_parallel_ranks"] = self.sharding.layout.data_parallel
            if self.sharded:
                env.update(layout=self.sharding.layout.id, sharded_modules=self.sharded)
        return env


def amp_unavailable(device_type: str) -> str | None:
    """OneFlow 0.9.0 has no mixed precision on CPU: eager ``autocast("cpu")`` disables itself
    with a warning, and nn.Graph's AMP pass leaves CPU kernels in fp32 (its bf16 graph gave the
    fp32 graph's loss to the last bit, here). Measuring that as "amp" would be a lie."""
    if device_type == "cpu":
        return ("OneFlow 0.9.0 has no CPU mixed precision (eager autocast('cpu') disables "
                "itself; nn.Graph's AMP leaves CPU kernels in fp32)")
    return None


# What OneFlow's strategies (global tensors with SBP signatures, parallel) cannot run, measured
# 2026-11-25 with OneFlow 0.9.0 on 2 CPU processes.
_GRAPH_ONLY = ("OneFlow 0.9 runs pipelines (set_stage) and ZeRO (enable_zero) in nn.Graph only: "
               "run the compiled case")


def zero_unavailable(kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
    """ZeRO (fsdp) is nn.Graph's ``enable_zero``, which aborts on CPU; on CUDA it is untried
    here, and not combined with the other kinds."""
    if device_type == "cpu":
        return ("OneFlow 0.9's ZeRO (nn.Graph enable_zero, stages 1-3) aborts on CPU once a "
                "tensor is sharded: 'register.cpp:75 Check failed: separated_header_mem_ptr()'")
    if len(kinds) > 1:
        return "OneFlow's ZeRO beside tp or pp is not ported"
    return None if compiled else _GRAPH_ONLY


def tp_unavailable(kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
    return None  # tensor parallelism runs eagerly and in nn.Graph


def stages_unavailable(kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
    """Pipelines run in nn.Graph only: eager global tensors would run the stages one after the
    other."""
    return None if compiled else _GRAPH_ONLY


register_strategy("oneflow", Checked("fsdp", zero_unavailable))
register_strategy("oneflow", Checked("tp", tp_unavailable))
register_strategy("oneflow", Checked("pp", stages_unavailable))


def compile_unavailable(device_type: str) -> str | None:
    return None  # nn.Graph compiles on CPU and CUDA alike


def eager_unavailable(device_type: str) -> str | None:
    return None  # eager global tensors under DDP run wherever OneFlow does


def build_trainer(spec: RankSpec, dist: DistEnv,
                  recipe: Callable[[BuildContext], Parts] | None) -> OneFlowTrainer:
    if recipe is None:
        raise ValueError("the oneflow adapter needs the workload's oneflow recipe")
    return OneFlowTrainer(spec, dist, recipe)
