"""What a recipe names under a torch layout, checked against its model before anything is
sharded: tensor parallelism's plan entries (matched as ``parallelize_module`` matches them, and
each style against the module kinds it can shard), the pipeline's split points, FSDP's units.
torch itself skips a plan entry that matches no module with a warning (the case then measured an
unsharded model as tp2) and fails a style on the wrong layer mid-launch naming no module.

Runs inside a rank; torch is passed in or imported inside the functions (the leading underscore
keeps ``frameworks.known_frameworks`` from taking it for an adapter).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from ...core.parallel import Layout
from ...core.workload import Parts, WorkloadError


def has(module: Any, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def _named(model: Any, names: Sequence[str]) -> str:
    """The model's module paths, for a message: those closest to ``names`` first, then the
    rest, at most twelve."""
    paths = [name for name, _ in model.named_modules() if name]
    close = [p for name in names for p in difflib.get_close_matches(name, paths, n=3)]
    shown = list(dict.fromkeys([*close, *paths]))[:12]
    more = f" and {len(paths) - len(shown)} more" if len(paths) > len(shown) else ""
    return f"its modules: {', '.join(shown) or 'none'}{more}"


def plan_targets(torch: Any, model: Any, plan: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each tensor-parallel plan entry's modules, matched as ``parallelize_module`` matches
    them (``fnmatch`` a dotted part at a time: ``layers.*.q``). An entry that matches nothing
    (torch warns and skips it: the case would measure an unsharded model as tp) or a module
    its style cannot shard (``ColwiseParallel`` and ``RowwiseParallel`` take ``nn.Linear`` and
    ``nn.Embedding``; torch says so mid-launch without naming the module) is a
    ``WorkloadError`` naming the entry."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    modules = dict(model.named_modules(remove_duplicate=False))
    targets: dict[str, list[str]] = {}
    for key, style in plan.items():
        pattern = key.split(".")
        matched = ([""] if not key else
                   [name for name in modules if name and len(name.split(".")) == len(pattern)
                    and all(map(fnmatchcase, name.split("."), pattern))])
        if not matched:
            raise WorkloadError(
                f"Parts.plans['tp'] names {key!r}, which matches no module of the model "
                f"({type(model).__name__}; {_named(model, [key])}): fix the entry's path "
                "(module names as model.named_modules() gives them, * for any one part); "
                "torch would skip it and the case would measure a model it did not shard")
        if isinstance(style, (ColwiseParallel, RowwiseParallel)):
            kinds = (torch.nn.Linear, torch.nn.Embedding)
            wrong = [f"{name} is {type(modules[name]).__name__}" for name in matched
                     if not isinstance(modules[name], kinds)]
            if wrong:
                raise WorkloadError(
                    f"Parts.plans['tp']: {key!r} -> {type(style).__name__}, which shards "
                    f"nn.Linear and nn.Embedding only, and {'; '.join(wrong[:3])}: plan that "
                    "module's Linear layers instead, or leave it replicated")
        targets[key] = sorted(matched)
    return targets


def check_names(torch: Any, model: Any, parts: Parts, layout: Layout,
                units: Sequence[str]) -> dict[str, Any]:
    """What the layout will shard, by kind, every name the recipe gave checked against the
    model first (a ``WorkloadError`` naming one that is not there): the plan's modules, the
    pipeline's split points, the FSDP units. Said in the results (``sharded_modules``)."""
    sharded: dict[str, Any] = {}
    if layout.uses("tp") and parts.plan("tp"):
        sharded["tp"] = sorted({name for names in plan_targets(torch, model,
                                                                parts.plan("tp")).values()
                                for name in names})
    if layout.uses("pp") and parts.plan("pp"):
        missing = [name for name in parts.plan("pp") if not has(model, name)]
        if missing:
            raise WorkloadError(f"Parts.plans['pp'] names {', '.join(map(repr, missing))}, "
                                f"not a module of the model ({_named(model, missing)})")
        sharded["pp"] = list(parts.plan("pp"))
    if layout.uses("fsdp"):
        missing = [name for name in units if not has(model, name)]
        if missing:
            raise WorkloadError(f"Parts.plans['fsdp'] names {', '.join(map(repr, missing))}, "
                                f"not a module of the model ({_named(model, missing)})")
        sharded["fsdp"] = [*units, "(root)"]
    return sharded
