"""PyTorch: a workload's ``nn.Module`` under DistributedDataParallel, or sharded as the case's
layout says (FSDP2, tensor and pipeline parallelism: ``parallel``), on the rank's runtime
(``runtime``: threads, device, process group, seed, waits, memory, environment).

Runs inside a worker rank. ``torch`` is imported in ``build_trainer`` only, so that the plugin can
read ``DISTRIBUTION`` without paying for a torch import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...core.spec import OptimizerSpec, RankSpec
from ...core.workload import BuildContext, Parts
from .. import Batches, DistEnv, PhasePlan, _optim, fresh, map_batch, require_parameters
from .._step import EagerStep, RuntimePeaks

# imported for what they register: classes and embedding register torch's pfc and emb strategies
from . import classes, embedding, parallel, phases, scaling  # noqa: F401
from .runtime import TorchRuntime

DISTRIBUTION = "torch"
INSTALL_HINT = None  # the pip extra
RECIPE_FOR = "torch"
COMPILER = "torch.compile"


class TorchTrainer(RuntimePeaks, EagerStep):
    """A workload's model, data, loss and optimizer trained on a rank's ``TorchRuntime`` (its
    device, process group, waits, memory and environment), one ``EagerStep`` at a time."""

    runtime: TorchRuntime

    def __init__(self, spec: RankSpec, dist: DistEnv,
                 recipe: Callable[[BuildContext], Parts]) -> None:
        import torch

        self._torch = torch
        self.dist = dist
        self.runtime = TorchRuntime(torch, spec, dist)
        self.layout = spec.parallel(dist.world_size)
        mesh = self.runtime.join(self.layout, spec)

        parts = recipe(spec.context(dist.rank, dist.world_size, dist.local_rank,
                                    str(self.device), mesh=mesh))
        model = parts.model.to(self.device)  # keeps the recipe's memory format
        self.parameters = sum(p.numel() for p in model.parameters())
        require_parameters(sum(p.numel() for p in model.parameters() if p.requires_grad), recipe)
        self.criterion = parts.loss or cross_entropy
        self.sharded: parallel.Sharded | None = None
        if not self.layout.is_data_parallel:
            if not parts.parallelized:
                parallel.same_weights(torch, model)
            example = None  # what a pipeline is traced with (no draw of fresh inputs else)
            if self.layout.uses("pp"):
                example = (fresh(parts.inputs) if parts.data is None
                           else next(iter(parts.data))[0])
            self.sharded = parallel.shard(torch, model, parts, self._to_device(example),
                                          self.layout, mesh, spec, self.device,
                                          self._pipeline_loss(spec))
            self.model_parts = self.sharded.modules
        elif dist.world_size > 1:
            self.model_parts = [model]
            # Gradients as views into the all-reduce buckets: no copy in and out of them.
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[dist.local_rank] if self.cuda else None,
                gradient_as_bucket_view=True,
            )
        else:
            self.model_parts = [model]
        self.model = model
        self.compiled = spec.compiled
        # torch.compile (inductor) of the whole model, DDP included (its graph breaks at the
        # all-reduce buckets): the first step traces and compiles, the warm-up absorbs it.
        # Under a layout, each block was compiled before sharding (parallel.compile_units).
        self.forward = (torch.compile(model) if self.compiled and self.sharded is None
                        else model)
        # Fused on CUDA: one kernel for the whole update, and GradScaler hands it the inf check
        # on the device (an unfused optimizer makes GradScaler.step read found_inf on the host:
        # a device sync in every AMP step).
        self.params = ([p for p in model.parameters() if p.requires_grad]
                       if self.sharded is None else self.sharded.parameters())
        self.optimizer = make_optimizer(torch, self.params, spec.optimizer, fused=self.cuda)
        self.clip_norm = spec.optimizer.clip_norm
        # Synthetic data resident on the device, as DLPerf's synthetic-data runs; or the
        # workload's own iterator, moved batch by batch inside the timed step.
        self.inputs = self._to_device(parts.inputs)
        self.targets = self._to_device(parts.targets)
        self.batches = Batches(parts.data) if parts.data is not None else None

        # FSDP's mixed-precision policy casts its parameters itself: no autocast around it.
        self.amp = spec.precision.enabled and not (self.sharded is not None
                                                   and self.sharded.mixed_precision)
        self.amp_dtype = getattr(torch, spec.precision.dtype)
        self.scaler = scaling.loss_scaler(torch, self.device, spec.precision.loss_scaling,
                                          sharded=self.sharded is not None)
        self._loss: Any = torch.zeros((), device=self.device)

    def _to_device(self, value: Any) -> Any:
        tensor = self._torch.Tensor
        return map_batch(value, lambda v: v.to(self.device, non_blocking=True)
                         if isinstance(v, tensor) else v)

    def _next_batch(self) -> tuple[Any, Any]:
        if self.batches is None:
            return fresh(self.inputs), fresh(self.targets)
        inputs, targets = self.batches.next()
        return self._to_device(inputs), self._to_device(targets)

    def _forward(self, inputs: Any, targets: Any) -> Any:
        """The loss; under a pipeline, the whole schedule (its backward included) and the last
        stage's loss, unscaled for the record (None on the other stages)."""
        torch = self._torch
        self.optimizer.zero_grad(set_to_none=True)
        sharded = self.sharded
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp):
            if sharded is not None and sharded.pipeline is not None:
                loss = sharded.pipeline.step(torch, inputs, targets)
                if loss is not None and self.scaler.is_enabled():
                    loss = loss / self.scaler.get_scale()
                return loss
            outputs = (self.forward(*inputs) if isinstance(inputs, tuple)
                       else self.forward(inputs))
            return self.criterion(outputs, targets)

    def _backward(self, loss: Any) -> None:
        """Backward (DDP's all-reduce overlapping it), and a layout's gradient averaging."""
        sharded = self.sharded
        if sharded is None or sharded.pipeline is None:
            self.scaler.scale(loss).backward()
        if sharded is not None:
            sharded.average_gradients(self._torch)
        self._loss = loss.detach() if loss is not None else None

    def _update(self) -> None:
        if self.clip_norm is not None:
            # On the all-reduced gradients (DDP averaged them in backward), unscaled first. No
            # host sync: the clip coefficient is applied on the device, and GradScaler skips
            # the step where the unscaled gradients hold an inf.
            self.scaler.unscale_(self.optimizer)
            if self.sharded is None:
                self._torch.nn.utils.clip_grad_norm_(self.params, self.clip_norm)
            else:  # the norm over every shard and stage
                self.sharded.clip(self._torch, self.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def phase_plan(self) -> PhasePlan:
        """The step in phases (``phases``)."""
        return phases.plan(self)

    @property
    def local_step(self) -> Callable[[], None] | None:
        """The straggler check's step, under plain data parallelism only: a sharded replica's
        ranks cannot step alone (every forward gathers, or waits for another stage)."""
        return self._local_step if self.sharded is None else None

    def _local_step(self) -> None:
        """Forward and backward on this rank alone, no all-reduce (DDP's ``no_sync``) and no
        update: the straggler check's measure of the rank's own speed. Eager, also in a
        compiled case (what is compared is one rank against the others)."""
        import contextlib

        torch = self._torch
        inputs, targets = self._next_batch()
        model = self.model
        no_sync = getattr(model, "no_sync", None)
        with no_sync() if no_sync is not None else contextlib.nullcontext():
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp):
                outputs = model(*inputs) if isinstance(inputs, tuple) else model(inputs)
                loss = self.criterion(outputs, targets)
            loss.backward()
        self.optimizer.zero_grad(set_to_none=True)

    def _pipeline_loss(self, spec: RankSpec) -> Callable[[Any, Any], Any]:
        """The loss a pipeline's last stage backpropagates: scaled where AMP scales losses."""
        if not spec.precision.loss_scaling:
            return self.criterion
        return lambda outputs, targets: self.scaler.scale(self.criterion(outputs, targets))

    def loss(self) -> float:
        """The last step's loss. A pipeline's exists on its last stage only: every rank gets
        the mean over the last stages (one per replica; a collective, outside the timing)."""
        sharded = self.sharded
        if sharded is None or sharded.pipeline is None:
            return float(self._loss.float().item())
        torch = self._torch
        value = (self._loss.float() if self._loss is not None
                 else torch.zeros((), dtype=torch.float32, device=self.device))
        torch.distributed.all_reduce(value)
        return float(value.item()) * self.layout.pp / self.dist.world_size

    def environment(self) -> dict[str, Any]:
        torch = self._torch
        env = self.runtime.environment()
        env.update(parameters=self.parameters, compiled=self.compiled)
        if self.sharded is not None:
            env.update(data_parallel_ranks=self.layout.data_parallel, layout=self.layout.id,
                       parameter_bytes_per_rank=self.sharded.parameter_bytes(torch),
                       sharded_modules=self.sharded.sharded)
        images = self.inputs if isinstance(self.inputs, torch.Tensor) else None
        if self.cuda and images is not None and images.dim() == 4:
            env["channels_last"] = images.is_contiguous(memory_format=torch.channels_last)
        return env


def make_optimizer(torch: Any, params: list[Any], opt: OptimizerSpec, fused: bool) -> Any:
    """The workload's optimizer over ``params`` (``_optim``: the kind, the decay groups);
    ``fused``: the single-kernel CUDA version. torch's own: the fused kernels, and their groups
    split by tensor class (``by_kind``)."""
    def sgd() -> Any:
        optimizer = torch.optim.SGD(by_kind([{"params": params}]), lr=opt.lr,
                                    momentum=opt.momentum, weight_decay=opt.weight_decay,
                                    fused=fused or None)
        if fused and opt.momentum:
            # Fused SGD allocates its momentum uninitialized on its first step and keeps it so
            # when GradScaler skips that step (an fp16 overflow at the initial scale): the next
            # step added what the memory held (NaN on an H200). Zeros from the start step the
            # same (no dampening: the first buffer is momentum x 0 + gradient, the gradient).
            for param in params:
                optimizer.state[param]["momentum_buffer"] = torch.zeros_like(
                    param, memory_format=torch.preserve_format)
        return optimizer

    def adamw() -> Any:
        # Fused on CPU too (torch >= 2.4): the for-loop version took 0.5 s of BERT-base's
        # 0.87 s CPU step, the fused one 0.1 s (measured here, batch 2, sequence 32).
        return torch.optim.AdamW(by_kind(_optim.decay_groups(params, opt)), lr=opt.lr,
                                 betas=opt.betas, eps=opt.eps, fused=True)

    return _optim.build("torch", opt, sgd=sgd, adamw=adamw)


def by_kind(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each parameter group split by tensor class: a fused kernel takes one group's tensors at
    once and refuses DTensors beside plain tensors (tensor parallelism leaves the parameters
    outside its plan plain). Plain data parallelism's groups come back as they were."""
    split: list[dict[str, Any]] = []
    for group in groups:
        kinds: dict[type, list[Any]] = {}
        for param in group["params"]:
            kinds.setdefault(type(param.data), []).append(param)
        split.extend({**group, "params": members} for members in kinds.values())
    return split


def cross_entropy(outputs: Any, targets: Any) -> Any:
    """The default loss: cross-entropy of class logits against integer labels, ``[B, C]``
    against ``[B]`` (or ``[B, C, ...]`` against ``[B, ...]``), and of a language model's
    ``[B, T, V]`` logits against ``[B, T]`` tokens, the mean over every token. A library
    model's output object (Hugging Face's ``ModelOutput``, any object or mapping with these
    fields): the ``loss`` the model computed (from ``labels`` it was given), else its
    ``logits``. Anything else is refused naming its type and the fix."""
    from torch import Tensor
    from torch.nn import functional

    if not isinstance(outputs, Tensor):
        read: Any = _library_output(outputs, Tensor)
        if read.dim() == 0:  # the loss the model computed
            return read
        outputs = read
    if outputs.dim() == 3 and targets.dim() == 2 and outputs.shape[:2] == targets.shape:
        return functional.cross_entropy(outputs.flatten(0, 1), targets.flatten())
    return functional.cross_entropy(outputs, targets)


def _library_output(outputs: Any, tensor: Any) -> Any:
    """The tensor the default loss reads from a model's non-tensor output: its ``loss`` (a
    scalar the model computed), else its ``logits``."""
    def field(name: str) -> Any:
        if isinstance(outputs, dict):
            return outputs.get(name)
        return getattr(outputs, name, None)

    loss, logits = field("loss"), field("logits")
    if isinstance(loss, tensor) and loss.dim() == 0:
        return loss
    if isinstance(logits, tensor):
        return logits
    kind = type(outputs)
    raise TypeError(
        f"the default loss (cross-entropy of logits against integer labels) cannot read the "
        f"model's output, a {kind.__module__}.{kind.__qualname__}: it takes a tensor of "
        f"logits, or an object or mapping with a `logits` tensor or a scalar `loss` (as "
        f"Hugging Face models return). Give the recipe's Parts a loss of your own, "
        f"Parts(..., loss=my_loss) with `def my_loss(outputs, targets)` returning a scalar "
        f"tensor (docs/own-model.md, \"A library's model\")")


def compile_unavailable(device_type: str) -> str | None:
    """Why torch.compile cannot run here, or None. Inductor builds C++ kernels on CPU and
    Triton kernels on CUDA."""
    import shutil

    if device_type == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
        return "inductor needs a C++ compiler (g++) on CPU and none is on PATH"
    return None


def amp_unavailable(device_type: str) -> str | None:
    return None  # autocast: bf16 on CPU, fp16 with a GradScaler on CUDA


def eager_unavailable(device_type: str) -> str | None:
    return None  # eager mode is torch's own


def build_trainer(spec: RankSpec, dist: DistEnv,
                  recipe: Callable[[BuildContext], Parts] | None) -> TorchTrainer:
    if recipe is None:
        raise ValueError("the torch adapter needs the workload's torch recipe")
    return TorchTrainer(spec, dist, recipe)
