"""The OneFlow adapter's layouts beyond plain data parallelism, on global tensors.

``frameworks/oneflow/__init__.py`` keeps data parallelism (DDP eagerly, a global batch in nn.Graph); a
case whose layout (``pytest_dlperf.core.parallel``) shards a replica places its model here, and
the training graph takes its stages, micro-batches and ZeRO from ``Sharding.configure``.

Runs inside a rank; OneFlow is passed in, never imported at module level (the leading
underscore keeps ``frameworks.known_frameworks`` from taking it for an adapter).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core.parallel import Layout
from ...core.strategies import Part, apply_part_strategies
from ...core.workload import Parts, WorkloadError


@dataclass(frozen=True, kw_only=True)
class OneFlowPart(Part):
    """What a OneFlow strategy's ``apply`` is given (a registered kind's: emb, pfc): a ``Part``
    (``module``: the model, its parameters already global on ``placement``, broadcast over the
    data ranks) and OneFlow itself (``flow``)."""

    flow: Any
    placement: Any


class Sharding:
    """A layout beyond data parallelism on OneFlow's global tensors (its SBP design): each
    parameter a global tensor on its pipeline stage's placement (ranks ``(data, tp)``),
    broadcast over the data ranks and split or broadcast over the tensor-parallel ones; OneFlow
    infers every activation's SBP and inserts the collectives itself, eagerly and in nn.Graph.

    ``Parts.plans['tp']`` maps module names to ``"colwise"`` (Linear weight ``[out, in]`` and bias
    split on dim 0, Megatron's column-parallel; an Embedding's hidden dim) or ``"rowwise"``
    (weight split on dim 1, bias broadcast; an Embedding's rows), or to ``{parameter name:
    flow.sbp}`` for anything else. Torch's words, not SBP objects: a plan then reads the same in
    both recipes, and SBP stays the adapter's. Any plan trains the same model (SBP inference
    keeps the maths whole); the plan only chooses the communication.
    ``Parts.plans['pp']`` names the modules stages begin at, in ``named_modules`` order: a
    module belongs to the stage of the last split at or before it. Pipelines and ZeRO (fsdp)
    run in nn.Graph only (``set_stage`` and gradient accumulation over the layout's
    micro-batches, OneFlow's actors ordering them; ``enable_zero(stage=3)``)."""

    def __init__(self, flow: Any, layout: Layout, parts: Parts, device_type: str) -> None:
        if layout.dp > 1 and layout.fsdp > 1:
            raise WorkloadError(f"layout {layout.id}: OneFlow's ZeRO shards over every "
                                "data-parallel rank; give dp or fsdp, not both")
        self.flow, self.layout, self.plan = flow, layout, dict(parts.plan("tp") or {})
        self.split = list(parts.plan("pp") or []) if layout.pp > 1 else []
        if layout.pp > 1 and len(self.split) != layout.pp - 1:
            raise WorkloadError(f"layout {layout.id}: the recipe's Parts.plans['pp'] names "
                                f"{len(self.split)} module(s); {layout.pp} stages need "
                                f"{layout.pp - 1} (OneFlow has no virtual stages)")
        width, tp = layout.data_parallel * layout.tp, layout.tp
        grids: list[Any] = [list(range(s * width, (s + 1) * width)) for s in range(layout.pp)]
        if layout.data_parallel > 1 and tp > 1:
            grids = [[g[i:i + tp] for i in range(0, width, tp)] for g in grids]
        self.stages = [flow.placement(device_type, ranks=g) for g in grids]
        self.everyone = flow.placement(device_type, ranks=list(range(layout.world_size)))

    def sbp(self, tp_sbp: Any, data: bool = False) -> tuple[Any, ...]:
        """A tensor's SBP over the placement's dimensions: data-parallel, then tensor-parallel."""
        split, broadcast = self.flow.sbp.split, self.flow.sbp.broadcast
        dims = ([split(0) if data else broadcast] if self.layout.data_parallel > 1 else []) + (
            [tp_sbp or broadcast if not data else broadcast] if self.layout.tp > 1 else [])
        return tuple(dims) or (broadcast,)

    def stage_of(self, model: Any) -> dict[str, int]:
        names = [name for name, _ in model.named_modules()]
        at = [names.index(n) if n in names else -1 for n in self.split]
        if -1 in at or at != sorted(at):
            raise WorkloadError(f"Parts.plans['pp'] {self.split} must name modules of the model "
                                "in the order named_modules() lists them")
        return {name: sum(i >= a for a in at) for i, name in enumerate(names)}

    def place(self, model: Any) -> Any:
        flow, stage_of, done = self.flow, self.stage_of(model), dict[Any, Any]()
        for name, module in model.named_modules():
            placement = self.stages[stage_of[name]]
            styles = _tp_styles(flow, module, self.plan.get(name))
            for key, param in module._parameters.items():
                if param is not None and param not in done:  # local -> whole -> sharded
                    whole = param.to_global(placement, self.sbp(None))
                    done[param] = flow.nn.Parameter(whole.to_global(
                        placement, self.sbp(styles.get(key))), requires_grad=param.requires_grad)
                module._parameters[key] = done.get(param)
            for key, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[key] = buffer.to_global(placement, self.sbp(None))
        self.stage_names = [(n, s) for n, s in stage_of.items() if n]
        return model

    def apply_strategies(self, model: Any, parts: Parts, spec: Any) -> dict[str, Any]:
        """The layout's kinds' part strategies on the placed model (one stage); what they
        sharded, by kind."""
        part = OneFlowPart(module=model, parts=parts, layout=self.layout, spec=spec,
                           flow=self.flow, placement=self.stages[0])
        return apply_part_strategies("oneflow", part).notes

    def configure(self, graph: Any) -> None:
        """Stages and micro-batches (pipelines), ZeRO-3 (fsdp) of the training graph."""
        if self.layout.fsdp > 1:  # untried: on CPU it is unavailable (its strategy's why_not)
            graph.config.enable_zero(True, stage=3)
        if self.layout.pp == 1:
            return
        graph.config.set_gradient_accumulation_steps(self.layout.stage_microbatches)
        for name, stage in self.stage_names:
            proxy = graph.model
            for part in name.split("."):
                proxy = getattr(proxy, part)
            proxy.to(self.flow.nn.graph.GraphModule).set_stage(stage, self.stages[stage])


def _tp_styles(flow: Any, module: Any, style: Any) -> dict[str, Any]:
    """A module's plan entry as ``{parameter name: SBP over the tensor-parallel ranks}``."""
    if style is None or isinstance(style, Mapping):
        return dict(style or {})
    split, embedding = flow.sbp.split, isinstance(module, flow.nn.Embedding)
    if style == "colwise":
        return {"weight": split(1 if embedding else 0), "bias": split(0)}
    if style == "rowwise":
        return {"weight": split(0 if embedding else 1), "bias": flow.sbp.broadcast}
    raise WorkloadError(f"Parts.plans['tp']: unknown style {style!r} (colwise, rowwise, or a mapping of "
                        "parameter names to flow.sbp)")
