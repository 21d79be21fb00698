"""What the JAX models share to stand under torch's names (``resnet50.jax``, ``bert.jax``,
``gpt.jax``): each model walks its layers in torch's order (``torch_variables``), and these turn
that walk into torch's named arrays and shapes, or set torch's arrays into the Flax variables.

A walk maps torch's name to (the Flax variable, the axes that put it in torch's layout, None
where the layouts agree): Flax's ``kernel`` of a ``Linear`` is (in, out) where torch's weight is
(out, in), a ``Conv``'s HWIO where torch's is OIHW; Flax's ``scale`` and ``embedding`` are
torch's ``weight``, a BatchNorm's ``mean`` and ``var`` its ``running_mean`` and
``running_var``. Flax's ``nnx.state`` lists variables sorted by path, not in a model's order,
which is why each model walks itself.

Flax is imported inside the functions: the pytest side imports the models and has no JAX.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Axes = tuple[int, ...] | None
Walk = dict[str, tuple[Any, Axes]]

# (torch's leaf name, Flax's attribute, the axes to torch's layout), per kind of layer.
LINEAR = (("weight", "kernel", (1, 0)), ("bias", "bias", None))  # (in, out) -> (out, in)
CONV = (("weight", "kernel", (3, 2, 0, 1)),)  # HWIO -> OIHW, no bias (ResNet's)
LAYER_NORM = (("weight", "scale", None), ("bias", "bias", None))
BATCH_NORM = (("weight", "scale", None), ("bias", "bias", None),
              ("running_mean", "mean", None), ("running_var", "var", None))
EMBED = (("weight", "embedding", None),)


def walk(layers: Iterable[tuple[str, Any]], own: tuple[tuple[str, str, Axes], ...] = ()
         ) -> Walk:
    """torch's name -> (variable, axes) for ``(torch's module path, the Flax layer)`` pairs in
    torch's order, each layer's variables in the order torch registers them; ``own``: the
    table of a layer of no known kind (a head's own bias)."""
    from flax import nnx

    kinds = ((nnx.Linear, LINEAR), (nnx.Conv, CONV), (nnx.LayerNorm, LAYER_NORM),
             (nnx.BatchNorm, BATCH_NORM), (nnx.Embed, EMBED))
    out: Walk = {}
    for prefix, layer in layers:
        table = next((table for kind, table in kinds if isinstance(layer, kind)), own)
        if not table:
            raise TypeError(f"{prefix}: a {type(layer).__name__} has no torch names here")
        for leaf, attribute, axes in table:
            out[f"{prefix}.{leaf}"] = (getattr(layer, attribute), axes)
    return out


def torch_shape(var: Any, axes: Axes) -> tuple[int, ...]:
    """A Flax variable's shape in torch's layout (``var.shape``: an abstract one's too, as
    ``nnx.eval_shape`` makes them)."""
    shape = tuple(int(d) for d in var.shape)
    return tuple(shape[i] for i in axes) if axes else shape


def named_arrays(variables: Walk) -> dict[str, Any]:
    """Every variable under torch's name, in torch's order, as a JAX array in torch's layout."""
    import jax.numpy as jnp

    return {name: jnp.transpose(var.get_value(), axes) if axes else var.get_value()
            for name, (var, axes) in variables.items()}


def named_shapes(variables: Walk) -> dict[str, tuple[int, ...]]:
    """The trainable ones' shapes under torch's names, in torch's order and layout (what the
    alignment tests compare with torch's ``named_parameters()``)."""
    from flax import nnx

    return {name: torch_shape(var, axes) for name, (var, axes) in variables.items()
            if isinstance(var, nnx.Param)}


def load(variables: Walk, arrays: Mapping[str, Any]) -> None:
    """Set every variable from torch's arrays by name, converted to Flax's layout. Refuses a
    missing or extra name, and every shape that differs, before setting anything."""
    import jax.numpy as jnp
    import numpy as np

    if set(variables) != set(arrays):
        raise ValueError(f"torch names without a parameter: "
                         f"{sorted(set(arrays) - set(variables))[:5]}; parameters without an "
                         f"array: {sorted(set(variables) - set(arrays))[:5]}")
    wrong = [f"{name}: torch's array is {tuple(arrays[name].shape)}, the parameter's in "
             f"torch's layout {torch_shape(var, axes)}" for name, (var, axes) in variables.items()
             if tuple(arrays[name].shape) != torch_shape(var, axes)]
    if wrong:
        raise ValueError("; ".join(wrong))
    for name, (var, axes) in variables.items():
        value = jnp.asarray(np.asarray(arrays[name]), var.get_value().dtype)
        if axes:  # back from torch's layout: the inverse permutation
            value = jnp.transpose(value, tuple(axes.index(i) for i in range(len(axes))))
        var.set_value(value)
