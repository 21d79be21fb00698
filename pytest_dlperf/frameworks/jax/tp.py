"""Tensor parallelism in the JAX adapter: the recipe's plan as shardings over a mesh axis
``tp``, and a step that ``jax.jit`` partitions itself (GSPMD).

The plan (``Parts.plans['tp']``) names modules by their path in the model (torch's names, as the
JAX models keep them) with a style: ``"colwise"`` (a ``Linear``'s output features split: its
kernel ``(in, out)`` by columns, its bias with them; Megatron's first matrix of a pair) or
``"rowwise"`` (its input features split: the kernel by rows, the bias whole; an ``Embed``'s
rows, the vocabulary). Every parameter the plan does not name is replicated over ``tp``; the
batch is split over ``data`` (the replicas) and the same on the ranks of one replica.

The step is the whole training step under ``jax.jit`` with the parameters' and the batch's
shardings: XLA's SPMD partitioner inserts the collectives (between a column- and a row-split
matrix one all-reduce of the activations, as Megatron's; the data-parallel gradient mean
over ``data``). The loss is the mean over the global batch, so the update is DDP's. Measured
on two CPU processes (2026-11-26): a column/row pair trained to the same loss as one process
(0.4271816 against 0.42718154) with one all-reduce in its program; ``shard_map`` with ``data``
manual and ``tp`` left to the partitioner failed XLA's check ("Cross-partition allreduce must
be in (partial) manual partitioning mode"), so a tp layout does not use the dp / fsdp step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...core.workload import WorkloadError
from .shardmap import clip_by_global_norm, loss_function

TP = "tp"
# style -> parameter name -> the axes of its PartitionSpec (Flax's layouts).
STYLES: dict[str, dict[str, tuple[str | None, ...]]] = {
    "colwise": {"kernel": (None, TP), "bias": (TP,)},
    "rowwise": {"kernel": (TP, None), "bias": (), "embedding": (TP, None)},
}


def _key(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def leaf_names(params: Any) -> list[tuple[str, str]]:
    """(module path, parameter name) of every leaf of ``params`` in ``jax.tree.flatten``'s
    order: ``("layers.0.attention.wq", "kernel")``."""
    import jax

    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = [_key(entry) for entry in path]
        if keys and keys[-1] == "value":  # a Variable's own node, where Flax keeps one
            keys = keys[:-1]
        out.append((".".join(keys[:-1]), keys[-1]))
    return out


def specs(names: list[tuple[str, str]], shapes: list[tuple[int, ...]],
          plan: Mapping[str, Any], degree: int) -> list[Any]:
    """Each parameter's ``PartitionSpec`` under ``plan``; refuses a style it does not know, a
    module it names that has no parameter, and a split the degree does not divide."""
    from jax.sharding import PartitionSpec as P

    unknown = sorted({str(style) for style in plan.values()} - set(STYLES))
    if unknown:
        raise WorkloadError(f"Parts.plans['tp']: the JAX adapter knows the styles "
                            f"{', '.join(sorted(STYLES))}, not {', '.join(unknown)}")
    missing = sorted(set(plan) - {module for module, _ in names})
    if missing:
        raise WorkloadError(f"Parts.plans['tp'] names {', '.join(missing[:3])}, which the model "
                            "has no parameters under (module paths as the model names them)")
    out = []
    for (module, name), shape in zip(names, shapes):
        style = plan.get(module)
        axes = () if style is None else STYLES[style].get(name)
        if axes is None:
            raise WorkloadError(f"Parts.plans['tp']: {module} is {style}, and the JAX adapter "
                                f"cannot split its {name!r} that way")
        for dim, axis in enumerate(axes):
            if axis == TP and shape[dim] % degree:
                raise WorkloadError(f"tensor parallelism of degree {degree} cannot split "
                                    f"{module}.{name} {shape} along dimension {dim}")
        out.append(P(*axes))
    return out


def make_step(graphdef: Any, loss_of: Callable[[Any, Any], Any], optimizer: Any,
              treedef: Any, clip_norm: float | None) -> Callable[..., Any]:
    """The global step ``(params, opt_state, rest, inputs, targets) -> (params, opt_state,
    rest, loss)`` for ``jax.jit`` to partition: the loss the global batch's mean, the gradient
    clipped by its global norm as torch's ``clip_grad_norm_``, then the optimizer."""
    import jax
    import optax

    loss_fn = loss_function(graphdef, loss_of, treedef)

    def step(leaves: list[Any], opt_state: Any, rest: Any, inputs: Any, targets: Any) -> Any:
        (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            leaves, rest, inputs, targets)
        if clip_norm is not None:  # global arrays: their norm is the whole gradient's
            grads = clip_by_global_norm(grads, [None] * len(grads), clip_norm)
        updates, opt_state = optimizer.update(grads, opt_state, leaves)
        return optax.apply_updates(leaves, updates), opt_state, rest, loss

    return step
