"""JAX (with Flax NNX models and Optax optimizers): a workload's ``nnx.Module`` trained by one
compiled step, ``jax.jit`` of a ``jax.shard_map`` over the ranks' devices (``shardmap``).

JAX 0.11 and later need Python >= 3.12, so its ranks run under their own interpreter
(``--dlperf-python jax=PATH``; ``scripts/setup-jax`` makes one). JAX has no launcher: the
plugin's launchers (local nodes, Slurm, external) start one process per device, and each calls
``jax.distributed.initialize`` from their variables (the coordinator, a service rank 0's
process hosts, at the launcher's spare port on the first node); the mesh is every process's
device on one axis, and the collectives are XLA's (gloo between CPU processes, NCCL between
GPUs).

Layouts: ``dp`` and ``fsdp`` (parameters, gradients and optimizer state sharded over the ranks;
``shardmap`` says how); ``tp`` with ``dp`` (the recipe's plan as shardings over a ``tp`` mesh
axis, the step partitioned by XLA: ``tp``). Pipeline parallelism is not ported.

The compiled axis: JAX trains under ``jax.jit``; without it every operation is dispatched and
compiled on its own, a debugging mode no training run uses, so the adapter's ``compiled`` is the
whole step under ``jax.jit`` and its ``eager`` cases skip, saying so (``eager_unavailable``).

AMP: JAX has no autocast; the models compute in bf16 (``BuildContext.amp_dtype``: the Flax
modules' ``dtype``) with fp32 parameters, gradients and optimizer state, and the loss in fp32.
On CUDA the plugin's AMP is fp16 with a loss scale, which this adapter does not implement.

JAX is asynchronous on CPU too: a step returns once it is dispatched (issue 44: a step handed
off in 0.1 ms finished at 85 ms), so ``synchronize`` blocks until the last step's outputs exist
(``jax.block_until_ready``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ...core.spec import OptimizerSpec, RankSpec
from ...core.strategies import Checked, Unported, register_strategy, why_not
from ...core.workload import BuildContext, Parts, WorkloadError
from .. import DistEnv, _loss, _optim, fresh, require_parameters
from .._step import OnRuntime
from . import shardmap, tp
from .runtime import JaxRuntime

DISTRIBUTION = ("jax",)
RECIPE_FOR = "jax"
COMPILER = "jax.jit (the whole step)"
INSTALL_HINT = ("JAX 0.12 needs Python >= 3.12: create its worker interpreter with "
                "scripts/setup-jax (in pytest-dlperf's repository) and run with "
                "--dlperf-python jax=$(scripts/setup-jax)")


class JaxTrainer(OnRuntime):
    """A workload's Flax model, loss and optimizer trained on a rank's ``JaxRuntime`` (its
    distributed runtime, mesh, waits and environment), one jitted step at a time."""

    runtime: JaxRuntime

    def __init__(self, spec: RankSpec, dist: DistEnv,
                 recipe: Callable[[BuildContext], Parts]) -> None:
        self.world_size = dist.world_size
        self.runtime = JaxRuntime(spec, dist)
        jax = self._jax = self.runtime.jax
        from flax import nnx

        self.layout = layout = spec.parallel(dist.world_size)
        refused = why_not("jax", layout.kinds, spec.device_type, compiled=True)
        if refused:
            raise WorkloadError(f"layout {layout.id}: {refused}")
        # tp1 (named on one rank) runs tp's step on a mesh of one, as torch's does.
        self.tp = layout.tp if layout.uses("tp") else 0
        parts = recipe(spec.context(dist.rank, dist.world_size, dist.local_rank,
                                    f"cuda:{dist.local_rank}" if self.cuda else "cpu"))
        self.mesh = self.runtime.mesh(self.tp)
        model = parts.model
        model.train()
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        leaves, self.treedef = jax.tree.flatten(params)
        shapes = [tuple(leaf.shape) for leaf in leaves]
        self.parameters = sum(math.prod(shape) for shape in shapes)
        require_parameters(self.parameters, recipe)
        self.dims = shardmap.shard_dims(shapes, dist.world_size, layout.uses("fsdp"))
        if self.tp:
            if not parts.plan("tp"):
                raise WorkloadError("a tensor-parallel layout needs the recipe's Parts.plans['tp'] "
                                    "(module path -> 'colwise' / 'rowwise')")
            self.specs = tp.specs(tp.leaf_names(params), shapes, parts.plan("tp"),
                                       self.tp)
        else:
            self.specs = [shardmap.partition(dim) for dim in self.dims]
        optimizer = make_optimizer(spec.optimizer, shapes)
        self.params = [self._global(leaf, spec) for leaf, spec in zip(leaves, self.specs)]
        self.rest = jax.tree.map(lambda leaf: self._global(leaf, None), rest)
        self.opt_state = self._optimizer_state(optimizer)
        loss_of = parts.loss or cross_entropy
        if self.tp:
            self._step = self._compile_global(tp.make_step(
                graphdef, loss_of, optimizer, self.treedef, spec.optimizer.clip_norm))
        else:
            self._step = self._compile(shardmap.make_step(
                graphdef, loss_of, optimizer, self.dims, self.treedef,
                spec.optimizer.clip_norm))
        self.inputs, self.targets = parts.inputs, parts.targets
        if parts.data is not None:
            raise WorkloadError("the JAX adapter trains on resident synthetic batches (Parts."
                                "inputs / targets); Parts.data is not ported")
        self._inputs = self._batch(self.inputs)
        self._loss: Any = None

    def _global(self, local: Any, spec: Any) -> Any:
        """A parameter or state leaf every rank holds whole (the same model on every rank) as
        one array over the mesh, laid out by ``spec`` (None: replicated)."""
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        sharding = NamedSharding(self.mesh, P() if spec is None else spec)
        return self._jax.make_array_from_callback(local.shape, sharding,
                                                  lambda index: local[index])

    def _optimizer_state(self, optimizer: Any) -> Any:
        """The optimizer's state over the mesh, made there: what mirrors a parameter (momentum,
        Adam's moments) sharded as the parameter is, the rest (Adam's step count) replicated.
        Left to itself, ``jit`` replicated the zeros a momentum starts from (they depend on no
        input), and a sharded parameter's update met a whole buffer."""
        import optax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        jax = self._jax
        shape = jax.eval_shape(optimizer.init, self.params)
        shardings = optax.tree_utils.tree_map_params(
            optimizer, lambda _, spec: NamedSharding(self.mesh, spec), shape, self.specs,
            transform_non_params=lambda _: NamedSharding(self.mesh, P()))
        return jax.jit(optimizer.init, out_shardings=shardings)(self.params)

    def _batch(self, local: Any) -> Any:
        """This rank's batch (an array or a tuple of them) as the global batch's shard."""
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        sharding = NamedSharding(self.mesh, P(shardmap.AXIS))
        make = self._jax.make_array_from_process_local_data
        if isinstance(local, (tuple, list)):
            return type(local)(make(sharding, part) for part in local)
        return make(sharding, local)

    def _compile(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """The step over the mesh, compiled whole; parameters, optimizer state and the model's
        state donated (updated in place)."""
        from jax.sharding import PartitionSpec as P

        jax = self._jax
        params = self.specs
        opt = jax.tree.map(lambda leaf: leaf.sharding.spec, self.opt_state)
        rest = jax.tree.map(lambda leaf: P(), self.rest)
        batch = P(shardmap.AXIS)
        mapped = jax.shard_map(step, mesh=self.mesh,
                               in_specs=(params, opt, rest, batch, batch),
                               out_specs=(params, opt, rest, P()))
        return jax.jit(mapped, donate_argnums=(0, 1, 2))  # type: ignore[no-any-return]

    def _compile_global(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """The global step compiled with every array's sharding: XLA partitions it."""
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        jax = self._jax
        params = [NamedSharding(self.mesh, spec) for spec in self.specs]
        opt = jax.tree.map(lambda leaf: leaf.sharding, self.opt_state)
        rest = jax.tree.map(lambda leaf: leaf.sharding, self.rest)
        batch = NamedSharding(self.mesh, P(shardmap.AXIS))
        return jax.jit(step, in_shardings=(params, opt, rest, batch, batch),  # type: ignore[no-any-return]
                       out_shardings=(params, opt, rest, NamedSharding(self.mesh, P())),
                       donate_argnums=(0, 1, 2))

    def step(self) -> None:
        targets = self._batch(fresh(self.targets))
        self.params, self.opt_state, self.rest, self._loss = self._step(
            self.params, self.opt_state, self.rest, self._inputs, targets)

    def synchronize(self) -> None:
        """Blocks until the last step's parameters, state and loss exist."""
        self.runtime.wait((self.params, self.opt_state, self.rest, self._loss))

    def loss(self) -> float:
        return 0.0 if self._loss is None else float(self._loss)

    def environment(self) -> dict[str, Any]:
        env = self.runtime.environment()
        env.update(parameters=self.parameters, compiled=True,
                   data_parallel_ranks=self.layout.data_parallel)
        return env

    def close(self) -> None:
        self.synchronize()


def cross_entropy(outputs: Any, targets: Any) -> Any:
    """The default loss (``_loss``): Optax's softmax cross-entropy, the mean over the batch (and
    over every token of a language model's ``[B, T, V]`` logits), in fp32 (bf16 logits under AMP
    cast up, as torch's autocast runs cross-entropy in fp32)."""
    import jax.numpy as jnp
    import optax

    criterion = _loss.cross_entropy(
        lambda logits, labels: optax.softmax_cross_entropy_with_integer_labels(
            logits, labels).mean(),
        fp32=lambda logits: logits.astype(jnp.float32))
    return criterion(outputs, targets)


def make_optimizer(opt: OptimizerSpec, shapes: list[tuple[int, ...]]) -> Any:
    """The workload's optimizer in Optax, torch's update: SGD with momentum (torch's buffer:
    ``momentum * buf + grad``, no dampening) after coupled weight decay (``grad + wd * p``);
    AdamW with bias correction and the decay decoupled (``p - lr * (adam + wd * p)``: torch's
    ``p * (1 - lr * wd) - lr * adam``); ``_optim``: the kind. The parameters the spec exempts
    from decay (1-D ones, by their whole shape: a shard's would mislead) get none: Optax's own
    spelling, a mask, for either kind."""
    import optax

    mask = [opt.decays(shape) for shape in shapes]
    return _optim.build(
        "jax", opt,
        sgd=lambda: optax.chain(optax.add_decayed_weights(opt.weight_decay, mask=mask),
                                optax.sgd(opt.lr, momentum=opt.momentum or None)),
        adamw=lambda: optax.adamw(opt.lr, b1=opt.betas[0], b2=opt.betas[1], eps=opt.eps,
                                  weight_decay=opt.weight_decay, mask=mask))


def eager_unavailable(device_type: str) -> str | None:
    return ("JAX trains under jax.jit (the whole step, compiled: the adapter's 'compiled'); "
            "op-by-op dispatch is a debugging mode no training run uses, not a figure to gate")


def compile_unavailable(device_type: str) -> str | None:
    return None


def amp_unavailable(device_type: str) -> str | None:
    if device_type == "cuda":
        return ("the plugin's CUDA AMP is fp16 with a loss scale, which the JAX adapter does not "
                "implement (its CPU AMP is bf16)")
    return None


def fsdp_beside_tp(kinds: tuple[str, ...], device_type: str, compiled: bool) -> str | None:
    """What the JAX adapter's fsdp and tp strategies cannot run: each other, or None."""
    if "fsdp" in kinds and "tp" in kinds:
        return ("the JAX adapter runs tp with dp, not with fsdp (fsdp's step is a shard_map, "
                "tp's a step XLA partitions: not ported together)")
    return None


# JAX's strategies: fsdp (a shard_map step, step) and tp (XLA's partitioner, tp).
register_strategy("jax", Checked("fsdp", fsdp_beside_tp))
register_strategy("jax", Checked("tp", fsdp_beside_tp))
register_strategy("jax", Unported("pp", "the JAX adapter runs dp, fsdp and tp layouts; pp is "
                                        "not ported"))


def build_trainer(spec: RankSpec, dist: DistEnv,
                  recipe: Callable[[BuildContext], Parts] | None) -> JaxTrainer:
    if recipe is None:
        raise ValueError("the jax adapter needs the workload's jax recipe")
    return JaxTrainer(spec, dist, recipe)
