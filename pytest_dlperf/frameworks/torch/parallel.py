"""The torch adapter's layouts beyond plain data parallelism: one small function per strategy.

``frameworks/torch/__init__.py`` keeps DDP; a case whose layout (``pytest_dlperf.core.parallel``) shards
a replica comes here. ``shard`` applies the strategies to a recipe's whole model in the one
order that works (torchtitan's): pipeline split, tensor parallelism, ``torch.compile`` of each
block, FSDP2 of each block and then of each root. What the step needs afterwards (this rank's
modules, a pipeline schedule, the groups gradients and norms are reduced over) is a ``Sharded``.

Runs inside a rank; torch is passed in or imported inside the functions, never at module level
(the leading underscore keeps ``frameworks.known_frameworks`` from taking it for an adapter).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.parallel import Layout, mesh_order
from ...core.spec import RankSpec
from ...core.strategies import (
    Checked,
    TorchPart,
    apply_part_strategies,
    register_strategy,
    why_not,
)
from ...core.workload import Parts, WorkloadError
from .names import check_names, has
from .pipeline import Pipeline, build_pipeline


def unavailable(kinds: tuple[str, ...], device_type: str, compiled: bool = False) -> str | None:
    """What the torch adapter cannot run of a layout of these kinds on ``device_type``
    (compiled: under torch.compile), or None: the check of its fsdp, tp and pp strategies."""
    if "pp" in kinds and "tp" in kinds:
        return ("pipeline x tensor parallelism: the torch adapter cuts pipelines by tracing "
                "(torch.distributed.pipelining.pipeline), and a traced stage holds no nn.Linear "
                "for a tensor-parallel plan to shard")
    if compiled and "tp" in kinds:
        # torch 2.14.1 on CPU, blocks compiled after parallelize_module (wrapped or in place):
        # backward fails in DTensor's redistribute ("'Tensor' object has no attribute
        # '_local_tensor'").
        return ("torch.compile with tensor parallelism: its backward fails in DTensor's "
                "redistribute here (a plain tensor where a DTensor was expected)")
    return None


def mesh_dims(layout: Layout) -> list[tuple[str, int]]:
    """The mesh's dimensions: those of more than one rank, and a kind named on one rank (FSDP's
    code on a mesh of one, so that its id says what ran)."""
    return [(kind, layout.degree(kind)) for kind in mesh_order() if layout.uses(kind)]


def device_mesh(layout: Layout, device_type: str) -> Any:
    """The layout's named DeviceMesh. The device type is always named: on a GPU host a gloo
    group let fully_shard move a CPU model to CUDA and crash (pytorch#132471)."""
    from torch.distributed.device_mesh import init_device_mesh

    names, shape = zip(*mesh_dims(layout))
    return init_device_mesh(device_type, tuple(shape), mesh_dim_names=tuple(names))


def same_weights(torch: Any, model: Any) -> None:
    """Every rank takes global rank 0's parameters and buffers. Each rank built the model under
    the seed plus its replica's index, so that its synthetic batch is its replica's (the batch
    DDP's rank of that index trains on: a layout and plain data parallelism see the same global
    batch); the weights must be one model's, and rank 0's are the ones DDP would broadcast."""
    dist = torch.distributed
    if dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def fsdp_unit_names(torch: Any, model: Any, parts: Parts) -> list[str]:
    """``Parts.plans['fsdp']``, or every module of every ``ModuleList`` (a transformer's blocks)."""
    if parts.plan("fsdp") is not None:
        return list(parts.plan("fsdp"))
    return [f"{name}.{index}" if name else str(index)
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.ModuleList) for index in range(len(module))]


def _replace(module: Any, name: str, new: Any) -> None:
    parent, _, child = name.rpartition(".")
    module.get_submodule(parent).register_module(child, new)


# -- one function per strategy ----------------------------------------------------------------

@dataclass(frozen=True)
class TensorParallel:
    """Megatron-style tensor parallelism, applied before torch.compile (its graphs trace the
    DTensor ops)."""

    kind: str = "tp"

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        return unavailable(kinds, device_type, compiled)

    def apply(self, part: TorchPart) -> None:
        apply_tp(part.module, part.mesh, part.parts)


@dataclass(frozen=True)
class FullyShard:
    """FSDP2 of each unit, then of the part's root, after torch.compile of each unit."""

    kind: str = "fsdp"

    def why_not(self, kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
        return unavailable(kinds, device_type, compiled)

    def apply(self, part: TorchPart) -> None:
        apply_fsdp(part.torch, part.module, part.mesh, part.units, part.layout, part.spec)


# torch's strategies: tensor parallelism and FSDP2 shard each part of the model; a pipeline
# cuts the model into stages first (``pipeline``), which its step then schedules.
register_strategy("torch", TensorParallel())
register_strategy("torch", FullyShard())
register_strategy("torch", Checked("pp", unavailable))


def apply_tp(model: Any, mesh: Any, parts: Parts) -> None:
    """Megatron-style tensor parallelism: the recipe's plan on the mesh's ``tp`` dimension."""
    if not parts.plan("tp"):
        raise WorkloadError("a tensor-parallel layout needs the recipe's Parts.plans['tp'] (module "
                            "name -> ColwiseParallel / RowwiseParallel ...), or a recipe that "
                            "shards the model itself on ctx.mesh (Parts.parallelized=True)")
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, mesh["tp"], dict(parts.plan("tp")))


def compile_units(torch: Any, model: Any, units: Sequence[str]) -> None:
    """``torch.compile`` of each block, before FSDP wraps it (torchtitan's order): its hooks
    stay outside the compiled graph. Parameter names gain ``_orig_mod.``.

    A pipeline stage's blocks are traced modules sharing one ``forward`` code object, each
    compiled as a recompilation of it: GPT-2's 12 blocks passed dynamo's limit of 8 on an H200
    (fullgraph=True then fails). The limit is raised to one per unit beside the default."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, len(units) + 8)
    for name in units:
        _replace(model, name, torch.compile(model.get_submodule(name), fullgraph=True))


def apply_fsdp(torch: Any, model: Any, mesh: Any, units: Sequence[str], layout: Layout,
               spec: RankSpec) -> None:
    """FSDP2: each unit sharded on its own (gathered for its own forward and backward), then
    the root. ``dp x fsdp`` is HSDP (replicated over ``dp``, sharded over ``fsdp``). AMP is
    FSDP's mixed-precision policy: parameters gathered in the autocast dtype, gradients reduced
    in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    data_mesh = mesh["dp", "fsdp"] if layout.dp > 1 else mesh["fsdp"]
    policy = MixedPrecisionPolicy()
    if spec.precision.enabled:
        policy = MixedPrecisionPolicy(param_dtype=getattr(torch, spec.precision.dtype),
                                      reduce_dtype=torch.float32)
    for name in units:
        fully_shard(model.get_submodule(name), mesh=data_mesh, mp_policy=policy)
    fully_shard(model, mesh=data_mesh, mp_policy=policy)


# -- what the step needs ------------------------------------------------------------------------

@dataclass
class Sharded:
    """A sharded replica as this rank holds it."""

    modules: list[Any]  # this rank's part of the model (the stages it holds, or the model)
    pipeline: Pipeline | None = None
    # Replicas not averaged by FSDP (``dp`` beside tensor or pipeline parallelism only): the
    # group their gradients are averaged over after backward.
    replica_group: Any = None
    stage_group: Any = None  # the pipeline's group: the gradient norm spans its stages
    mixed_precision: bool = False  # FSDP's policy casts: no autocast around it
    units: list[str] = field(default_factory=list)
    sharded: dict[str, Any] = field(default_factory=dict)  # check_names: by kind
    # A strategy's replicated parameters beside its shards (TorchPart.averaged): averaged
    # over their group after backward.
    averaged: list[tuple[list[Any], Any]] = field(default_factory=list)

    def parameters(self) -> list[Any]:
        return [p for module in self.modules for p in module.parameters() if p.requires_grad]

    def average_gradients(self, torch: Any) -> None:
        """Data parallelism beside tensor or pipeline parallelism without FSDP: the replicas'
        gradients averaged (after backward, not overlapped with it as DDP's buckets are); and
        what a strategy left replicated beside its shards, over its group."""
        groups = list(self.averaged)
        if self.replica_group is not None:
            groups.append((self.parameters(), self.replica_group))
        dist = torch.distributed
        for params, group in groups:
            size = dist.get_world_size(group)
            for param in params:
                if param.grad is not None:
                    grad = local(torch, param.grad)
                    dist.all_reduce(grad, group=group)
                    grad.div_(size)

    def clip(self, torch: Any, max_norm: float) -> Any:
        """The global gradient norm over every shard and stage, clipped to ``max_norm``."""
        params = [p for p in self.parameters() if p.grad is not None]
        groups = _by_mesh(params)
        if self.stage_group is None and len(groups) == 1:
            # One mesh and no stages: torch's own clip takes the norm over the shards (a
            # DTensor's norm reduces them), as a hand-written FSDP2 loop does; the general path
            # below cost ~2% of a small GPT's FSDP2 step here in Python alone.
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        squares = torch.zeros((), dtype=torch.float32, device=params[0].grad.device
                              if params else None)
        # A norm a mesh and placement (under fsdp x tp the norms' and the matrices' gradients
        # live on different meshes, which one stack of norms refuses), summed as squares.
        for group in groups:
            norm = torch.nn.utils.get_total_norm([p.grad for p in group])
            if hasattr(norm, "full_tensor"):  # a DTensor: the sum over its shards
                norm = norm.full_tensor()
            squares = squares + norm.float() ** 2
        if self.stage_group is not None:
            torch.distributed.all_reduce(squares, group=self.stage_group)
        total = squares.sqrt()
        for group in groups:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total

    def parameter_bytes(self, torch: Any) -> int:
        """Bytes of the parameters this rank holds (its shards, its stages)."""
        return sum(local(torch, p).numel() * p.element_size()
                   for module in self.modules for p in module.parameters())


def _by_mesh(params: list[Any]) -> list[list[Any]]:
    """``params`` grouped by their gradients' mesh and placements (plain tensors: one group)."""
    groups: dict[Any, list[Any]] = {}
    for param in params:
        grad = param.grad
        mesh = getattr(grad, "device_mesh", None)
        key = None if mesh is None else (id(mesh), tuple(grad.placements))
        groups.setdefault(key, []).append(param)
    return list(groups.values())


def local(torch: Any, tensor: Any) -> Any:
    """A DTensor's shard on this rank (the tensor itself otherwise)."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def shard(torch: Any, model: Any, parts: Parts, inputs: Any, layout: Layout, mesh: Any,
          spec: RankSpec, device: Any, loss: Callable[[Any, Any], Any]) -> Sharded:
    """The recipe's whole model, sharded as the layout says."""
    if parts.parallelized:
        if layout.uses("pp"):
            raise WorkloadError("Parts.parallelized with a pipeline layout: the adapter cuts "
                                "the pipeline itself; return the unsharded model with "
                                "Parts.plans['pp']")
        return Sharded([model])
    reason = why_not("torch", layout.kinds, spec.device_type, spec.compiled)
    if reason:
        raise WorkloadError(f"layout {layout.id}: {reason}")
    units = fsdp_unit_names(torch, model, parts)
    sharded = check_names(torch, model, parts, layout, units)

    averaged: list[tuple[list[Any], Any]] = []
    wrapping = set(layout.kinds) - {"tp"}

    def shard_part(module: Any) -> None:
        # torchtitan's order: tensor parallelism, torch.compile of each block, then what wraps
        # the compiled blocks (FSDP2, a registered kind's strategy), in the layout's order.
        held = tuple(name for name in units if has(module, name))
        part = TorchPart(module=module, parts=parts, layout=layout, spec=spec, notes=sharded,
                         torch=torch, mesh=mesh, units=held, averaged=averaged)
        apply_part_strategies("torch", part, kinds=("tp",))
        if spec.compiled:
            compile_units(torch, module, held)
        apply_part_strategies("torch", part, kinds=wrapping)

    if layout.uses("pp"):
        pipeline = build_pipeline(torch, model, inputs, layout, mesh, parts, device, loss,
                                  shard_part)
        modules = [stage.submod for stage in pipeline.stages]
    else:
        pipeline = None
        shard_part(model)
        modules = [model]
    replicas = mesh["dp"].get_group() if layout.dp > 1 and not layout.uses("fsdp") else None
    return Sharded(modules, pipeline, replica_group=replicas,
                   stage_group=mesh["pp"].get_group() if layout.uses("pp") else None,
                   mixed_precision=layout.uses("fsdp") and spec.precision.enabled,
                   units=units, sharded=sharded, averaged=averaged)
