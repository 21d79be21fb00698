"""The JAX adapter's training step: one ``jax.shard_map`` over the ranks' devices (the mesh's
one axis, ``"data"``), compiled whole by ``jax.jit``: forward, backward, the collectives, the
clip and the update in one XLA program.

What each layout does inside it, per parameter:

- ``dp`` (DDP's step): the parameter replicated; marked per-device (``pcast(..., to="varying")``)
  before the gradient is taken, then the gradient is averaged (``pmean``). Without the mark,
  ``shard_map`` (``check_vma``) hands back the gradient of a replicated input already summed over
  the devices, and a ``pmean`` on top doubles it (issue 44 saw it).
- ``fsdp`` (FSDP's / ZeRO-3's step): the parameter, its gradient and its optimizer state sharded
  along one dimension; the forward gathers it whole (``all_gather``), whose transpose in backward
  is a reduce-scatter: the summed gradient's shard, divided by the ranks for the mean. A
  parameter no dimension of which the ranks divide stays replicated, as under ``dp``.

Each rank's loss is its own batch's mean, so the update is DDP's: the mean of the ranks'
gradients, clipped by their global norm (torch's ``clip_grad_norm_``: the sharded gradients'
squares summed over the ranks), then the optimizer. The model's other state (BatchNorm's
running statistics, dropout's RNG counters) is replicated: statistics computed from each rank's
batch are averaged over the ranks (every rank holds the same, as DDP's broadcast buffers make
them), the rest is the same on every rank by construction.

JAX is imported inside the functions: the pytest side imports the adapter and has no JAX.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

AXIS = "data"


def shard_dims(shapes: list[tuple[int, ...]], ranks: int, fsdp: bool) -> list[int | None]:
    """The dimension each parameter is sharded along (None: replicated): under ``fsdp``, its
    first dimension the ranks divide; replicated everywhere under ``dp`` and on one rank."""
    if not fsdp or ranks == 1:
        return [None] * len(shapes)
    return [next((d for d, size in enumerate(shape) if size % ranks == 0), None)
            for shape in shapes]


def partition(dim: int | None) -> Any:
    """The ``PartitionSpec`` of a parameter sharded along ``dim`` (None: replicated)."""
    from jax.sharding import PartitionSpec as P

    if dim is None:
        return P()
    return P(*([None] * dim + [AXIS]))


def clip_by_global_norm(grads: list[Any], dims: list[int | None], max_norm: float) -> list[Any]:
    """torch's ``clip_grad_norm_`` on the mean gradients: every one scaled by ``max_norm /
    (norm + 1e-6)`` where their global norm is above ``max_norm`` (optax's clip divides by the
    norm alone). A sharded gradient's squares are summed over the ranks; a replicated one's are
    the same on every rank and counted once."""
    import jax
    import jax.numpy as jnp

    local = sum((jnp.sum(jnp.square(g.astype(jnp.float32))) for g, d in zip(grads, dims)
                 if d is not None), start=jnp.float32(0))
    total = jax.lax.psum(local, AXIS) if any(d is not None for d in dims) else local
    total += sum((jnp.sum(jnp.square(g.astype(jnp.float32))) for g, d in zip(grads, dims)
                  if d is None), start=jnp.float32(0))
    scale = jnp.minimum(max_norm / (jnp.sqrt(total) + 1e-6), 1.0)
    return [g * scale.astype(g.dtype) for g in grads]


def varying_axes(value: Any) -> frozenset[str]:
    """The mesh axes along which ``value`` differs between the devices inside ``shard_map``:
    its type's ``manual_axis_type.varying`` (jax 0.12; ``vma`` before)."""
    import jax

    kind = jax.typeof(value)
    manual = getattr(kind, "manual_axis_type", None)
    return frozenset(manual.varying if manual is not None else getattr(kind, "vma", ()))


def mean_gradients(grads: list[Any], dims: list[int | None]) -> list[Any]:
    """The ranks' mean gradients: a sharded one's reduce-scattered sum divided by the ranks;
    the replicated ones averaged in one all-reduce of them all, packed into one buffer (as DDP
    buckets them: one collective a gradient, ~50 for the CPU GPT, left two ranks at 0.37 of
    one's throughput against torch's 0.94)."""
    import jax
    import jax.numpy as jnp

    ranks = jax.lax.axis_size(AXIS)
    out = [g / ranks if d is not None else None for g, d in zip(grads, dims)]
    whole = [i for i, d in enumerate(dims) if d is None]
    if whole:
        flat = jax.lax.pmean(jnp.concatenate([grads[i].ravel() for i in whole]), AXIS)
        offset = 0
        for i in whole:
            size = grads[i].size
            out[i] = flat[offset:offset + size].reshape(grads[i].shape)
            offset += size
    return out


def gathered(leaves: list[Any], dims: list[int | None]) -> list[Any]:
    """Every parameter whole: the sharded ones' shards gathered from the ranks in one
    all-gather of them all, packed into one buffer (FSDP's flat parameter; one collective a
    parameter left two ranks at 0.26 of one's throughput on the CPU GPT). Its transpose in
    backward is one reduce-scatter of the packed gradients."""
    import jax
    import jax.numpy as jnp

    sharded = [i for i, d in enumerate(dims) if d is not None]
    if not sharded:
        return list(leaves)
    dtype = jnp.result_type(*(leaves[i].dtype for i in sharded))
    flat = jnp.concatenate([leaves[i].astype(dtype).ravel() for i in sharded])
    every = jax.lax.all_gather(flat, AXIS, axis=0, tiled=False)  # [ranks, packed]
    out = list(leaves)
    offset = 0
    for i in sharded:
        shard, dim = leaves[i], dims[i]
        assert dim is not None
        piece = every[:, offset:offset + shard.size].reshape(every.shape[0], *shard.shape)
        # the ranks' shards side by side along the sharded dimension, in rank order
        piece = jnp.moveaxis(piece, 0, dim)
        shape = list(shard.shape)
        shape[dim] *= every.shape[0]
        out[i] = piece.reshape(shape).astype(shard.dtype)
        offset += shard.size
    return out


def averaged_state(state: Any) -> Any:
    """The model's non-parameter state after a step, the same on every rank: what each rank
    computed from its own batch (BatchNorm's statistics) averaged over the ranks, the rest
    (RNG counters, the same on every rank) as it is."""
    import jax
    import jax.numpy as jnp

    def replicated(leaf: Any) -> Any:
        if AXIS not in varying_axes(leaf):
            return leaf
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            return jax.lax.pmean(leaf, AXIS)
        return jax.lax.pmax(leaf, AXIS)

    return jax.tree.map(replicated, state)


def loss_function(graphdef: Any, loss_of: Callable[[Any, Any], Any], treedef: Any,
                  whole: Callable[[list[Any]], list[Any]] = list) -> Callable[..., Any]:
    """``(leaves, rest, inputs, targets) -> (loss, the model's other state)``: the model merged
    from its parameters (``whole`` of the flat leaves, e.g. fsdp's gathered shards), run on the
    batch."""
    import jax
    from flax import nnx

    def loss_fn(leaves: list[Any], rest: Any, inputs: Any, targets: Any) -> Any:
        params = jax.tree.unflatten(treedef, whole(leaves))
        # copy=True: the Variables made afresh in this trace (BatchNorm writes its statistics
        # into them; into the caller's, from inside the gradient's trace, it may not).
        model = nnx.merge(graphdef, params, rest, copy=True)
        outputs = model(*inputs) if isinstance(inputs, tuple) else model(inputs)
        return loss_of(outputs, targets), nnx.state(model, nnx.Not(nnx.Param))

    return loss_fn


def make_step(graphdef: Any, loss_of: Callable[[Any, Any], Any], optimizer: Any,
              dims: list[int | None], treedef: Any, clip_norm: float | None
              ) -> Callable[..., Any]:
    """The per-device step ``(params, opt_state, rest, inputs, targets) -> (params, opt_state,
    rest, loss)`` that ``shard_map`` runs on each rank (``params`` a flat list in ``treedef``'s
    order; ``dims`` as ``shard_dims``)."""
    import jax
    import optax

    loss_fn = loss_function(graphdef, loss_of, treedef, lambda leaves: gathered(leaves, dims))

    def step(leaves: list[Any], opt_state: Any, rest: Any, inputs: Any, targets: Any) -> Any:
        # Replicated parameters marked per-device outside the differentiated function: inside
        # it, the mark's transpose would sum their gradients over the ranks (a pmean on top
        # then gave twice DDP's update: tests/test_jax.py).
        own = [jax.lax.pcast(p, AXIS, to="varying") if d is None else p
               for p, d in zip(leaves, dims)]
        (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            own, rest, inputs, targets)
        grads = mean_gradients(grads, dims)
        if clip_norm is not None:
            grads = clip_by_global_norm(grads, dims, clip_norm)
        updates, opt_state = optimizer.update(grads, opt_state, leaves)
        leaves = optax.apply_updates(leaves, updates)
        return leaves, opt_state, averaged_state(rest), jax.lax.pmean(loss, AXIS)

    return step
