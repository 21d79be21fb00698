"""Framework adapters: one package per framework (``frameworks/<name>/``), each behind the same
small interface; beside them, what every adapter shares (``_step``: the trainer's base on its
runtime, the eager step and its defaults; ``_optim``, ``_loss``: the workload's optimizer and the
default loss where frameworks differ only in spelling; ``_contract``: a user's adapter completed
to the protocol; ``_roles``, ``_loss_scale``).

An adapter is what is framework-specific and model-independent: process group, data-parallel
wrapper, device placement, AMP, the compiler, synchronization. The model comes from the
workload's recipe for that framework (``pytest_dlperf.core.workload``; ResNet-50's are in
``pytest_dlperf.models``). A framework's package face (``frameworks/<name>/__init__.py``; its
runtime, phases, optimizer and strategies in modules beside it; a user's adapter may be one
module) defines, without importing the framework at module level:

- ``DISTRIBUTION``: the package whose installed version enters the baseline fingerprint (or a
  tuple of packages that provide the framework, first installed wins);
- ``RECIPE_FOR``: which key of ``Workload.recipes`` it builds models from (the built-in
  adapters: their own name). An adapter without it trains on its own and gets no recipe;
- ``build_trainer(spec, dist, recipe) -> Trainer``: called inside each worker rank with the
  ``RankSpec``, the rank's place in the job and the imported recipe (or None); it sets the
  framework's process group up itself.

and, in a built-in adapter (``_contract.AdapterModule``, which mypy checks them against; a
user's adapter may leave them out, and ``_contract.UserAdapter`` says "nothing refused"):

- ``INSTALL_HINT``: what to do when the framework is not installed (None: the pip extra);
- ``COMPILER``: what its ``compiled`` mode is (``"torch.compile"``); the options' help and the
  docs list the built-in adapters' from here;
- ``compile_unavailable(device_type) -> str | None``: why its ``compiled`` mode cannot run here;
- ``eager_unavailable(device_type) -> str | None``: why it has no ``eager`` mode to measure (JAX:
  its training runs are compiled);
- ``amp_unavailable(device_type) -> str | None``: why it has no mixed precision on that device.

The layout kinds it runs beyond data parallelism are the strategies it registers for them when
imported (``core/strategies.py``).

A trainer may also offer ``phase_plan() -> PhasePlan``: its step cut into phases, for the
diagnostic steps after the timed windows (``pytest_dlperf.rank.phases``; without it a case
reports no phases, saying so).

A framework may run its ranks under another interpreter (``--dlperf-python``); the worker side
(this package's ``worker``, ``meter``, ``protocol``, ``spec``, ``workload``, ``jsonio`` and this
module) needs only the standard library, on Python 3.10 or later.

Adding a framework is adding one such module; nothing else dispatches on framework names.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from ..core.phases import BACKWARD, DATA, FORWARD, OPTIMIZER
from ..core.workload import WorkloadError


class Trainer(Protocol):
    """One rank's training loop, as the meter drives it."""

    def step(self) -> None:
        """One optimizer step on one per-device batch; may return before the device is done."""

    def synchronize(self) -> None:
        """Wait until every step issued so far has finished on the device."""

    def loss(self) -> float:
        """The last step's loss (waits for it)."""

    def environment(self) -> dict[str, Any]:
        """Versions and device facts this rank saw, for the results and the fingerprint."""

    def close(self) -> None:
        """Tear the process group down."""

    # -- optional: ``_step.OnRuntime`` (every built-in trainer's base) and, for a user's own
    # adapter's trainer, ``_contract.UserTrainer`` answer each with "none"

    @property
    def local_step(self) -> Callable[[], None] | None:
        """The straggler check's step: forward and backward on this rank alone, no collective
        and no update (None: the trainer has none, or not under this layout)."""

    def local_synchronize(self) -> None:
        """Wait for ``local_step``'s work (default: ``synchronize``)."""

    def phase_plan(self) -> PhasePlan | None:
        """The step cut into phases for the diagnostic steps (None: it cannot be cut)."""

    def reset_peak_memory(self) -> None:
        """Start the device's peak-memory counters afresh (CUDA; default: nothing to reset)."""

    def peak_memory(self) -> dict[str, int]:
        """The device's peak-memory counters since the reset (default: none)."""


@dataclass
class PhasePlan:
    """A trainer's training step cut into phases, for the diagnostic steps after the timed
    windows: run one after the other, ``phases`` are one whole training step (the phase names
    of ``pytest_dlperf.core.phases``: data, forward, backward, optimizer; neighbours the
    framework runs as one are merged under one name, ``"forward+backward+optimizer"``, and
    ``note`` says why). Each phase keeps what the next needs on the trainer.

    ``communicate(on)`` switches the gradient communication on or off for the steps that
    follow (DDP: a comm hook that returns the bucket untouched); None where it cannot be
    separated from the phases (a layout's collectives inside forward and backward).
    ``all_reduce()`` all-reduces the gradients' bytes as training buckets them, alone;
    ``ping()`` all-reduces one element (a barrier, and the per-collective latency). ``how``
    says, for the results, how the communication was switched off and timed."""

    phases: list[tuple[str, Callable[[], None]]]
    communicate: Callable[[bool], None] | None = None
    all_reduce: Callable[[], None] | None = None
    ping: Callable[[], None] | None = None
    gradient_bytes: int = 0
    buckets: int = 0
    how: str = ""
    note: str = ""


def step_phases(next_batch: Callable[[], tuple[Any, Any]], forward: Callable[[Any, Any], Any],
                backward: Callable[[Any], None], update: Callable[[], None]
                ) -> list[tuple[str, Callable[[], None]]]:
    """A trainer's step, written as its four methods (the batch, the loss from it, backward
    from the loss, the update), as the four standard phases of a ``PhasePlan``: each phase
    keeps what the next one needs."""
    state: dict[str, Any] = {}

    def data() -> None:
        state["batch"] = next_batch()

    def forward_phase() -> None:
        state["loss"] = forward(*state.pop("batch"))

    def backward_phase() -> None:
        backward(state.pop("loss"))

    return [(DATA, data), (FORWARD, forward_phase), (BACKWARD, backward_phase),
            (OPTIMIZER, update)]


# DDP's (and Paddle DataParallel's) bucket sizes: the first small, so that its all-reduce starts
# early in backward, the rest 25 MiB.
FIRST_BUCKET_BYTES = 1024 * 1024
BUCKET_BYTES = 25 * 1024 * 1024


def bucket_elements(gradients: list[tuple[int, int]]) -> list[int]:
    """Elements per bucket of gradients given as ``(elements, bytes per element)`` in
    parameter order, cut as DDP buckets them: in the order backward produces them (the
    parameters reversed), 1 MiB first, then 25 MiB; a gradient larger than a bucket is a
    bucket of its own."""
    sizes: list[int] = []
    limit, filled = FIRST_BUCKET_BYTES, 0
    for elements, item in reversed(gradients):
        size = elements * item
        if sizes and filled + size <= limit:
            sizes[-1] += elements
            filled += size
        else:
            if sizes:
                limit = BUCKET_BYTES
            sizes.append(elements)
            filled = size
    return sizes


class DeviceUnavailable(RuntimeError):
    """The framework, as installed, cannot use the device this case asked for (a CPU-only
    build on a GPU host, say). The rank reports the message alone: it is the reason, and a
    traceback through the adapter would only hide it."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job, as the launcher (torchrun, srun, ...) told it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> DistEnv:
        world = int(environ.get("WORLD_SIZE", "1"))
        local_world = int(environ.get("LOCAL_WORLD_SIZE", str(world)))
        return cls(
            rank=int(environ.get("RANK", "0")),
            world_size=world,
            local_rank=int(environ.get("LOCAL_RANK", "0")),
            local_world_size=local_world,
            node_rank=int(environ.get("GROUP_RANK", environ.get("NODE_RANK", "0"))),
        )


# Set to "rank0" by the local launcher for ranks it starts without agents: rank 0 hosts the
# world's store on MASTER_ADDR:PORT (under torchrun, the agent's store serves instead).
STORE_VARIABLE = "DLPERF_STORE"
# Stores this rank hosts (rank 0 of ranks started without agents): the server lives as long as
# its object, and the other ranks may still be reading from it when this rank has its answer.
_HOSTED_STORES: list[Any] = []
# This process's store clients by (address, port): ``exchange`` may be called every step (a
# framework of one's own averaging its gradients through it, docs/adding-a-framework.md).
_STORES: dict[tuple[str, int], Any] = {}


def exchange(dist: DistEnv, key: str, value: str, timeout_s: float = 600.0) -> list[str]:
    """Every rank's ``value`` for ``key``, in rank order, swapped through the world's key-value
    store: the store of the torchrun agent that started this rank (its rendezvous store), or,
    for one node's ranks started without agents, the one rank 0 hosts on MASTER_ADDR:PORT (as
    torch's env:// rendezvous does). For frameworks that need all peers' addresses before they
    start (TensorFlow's TF_CONFIG), or a small framework's gradients every step (keys must then
    differ from call to call). torch is importable wherever torchrun is."""
    import os
    from datetime import timedelta

    import torch.distributed as torch_dist

    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    rank0_store = os.environ.get(STORE_VARIABLE) == "rank0"
    if not (agent_store or rank0_store):
        raise RuntimeError("this rank was started neither by a torchrun agent with a store "
                           "(TORCHELASTIC_USE_AGENT_STORE) nor by pytest-dlperf's local launcher "
                           f"({STORE_VARIABLE}=rank0); give every rank's address in the spec")
    host = rank0_store and dist.rank == 0
    where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store = _STORES.get(where)
    if store is None:  # one connection (and one hosted server) a process, reused by every call
        store = _STORES[where] = torch_dist.TCPStore(  # type: ignore[attr-defined]
            where[0], where[1], dist.world_size, is_master=host,
            timeout=timedelta(seconds=timeout_s))
        if host:
            _HOSTED_STORES.append(store)
    store.set(f"dlperf/{key}/{dist.rank}", value)
    keys = [f"dlperf/{key}/{rank}" for rank in range(dist.world_size)]
    store.wait(keys, timedelta(seconds=timeout_s))
    return [store.get(k).decode() for k in keys]


def module_name(name: str) -> str:
    """``torch`` -> this package's adapter; any other name is the user's own adapter module,
    top-level (``fsdp_adapter``) or dotted (``perf.adapters.fsdp``)."""
    return f"{__name__}.{name}" if name in known_frameworks() else name


def load(name: str, path: str | None = None) -> ModuleType:
    """The adapter module for ``name``; a clear error when there is none. ``path``: the folder
    a user's own adapter is imported from (its import root on the pytest side), put first on
    ``sys.path`` in a rank."""
    if path and path not in sys.path:
        sys.path.insert(0, path)
    target = module_name(name)
    known = ", ".join(known_frameworks()) or "none"
    try:
        found = all(part.isidentifier() for part in name.split(".")) and \
            importlib.util.find_spec(target) is not None
    except ModuleNotFoundError:  # the parent package of a dotted name is missing
        found = False
    if not found:
        raise LookupError(f"no framework adapter named {name!r} (known: {known}; or your own "
                          "adapter: an importable module, top-level or dotted, that defines "
                          "DISTRIBUTION and build_trainer)")
    module = importlib.import_module(target)
    missing = [attr for attr in ("DISTRIBUTION", "build_trainer") if not hasattr(module, attr)]
    if missing:
        raise LookupError(f"{name!r} is a module ({getattr(module, '__file__', '?')}) but not a "
                          f"framework adapter: it defines no {' or '.join(missing)} (see "
                          f"docs/adding-a-framework.md; known adapters: {known})")
    return module


def compilers() -> dict[str, str]:
    """What ``compiled`` means in each built-in adapter, by name (its ``COMPILER``)."""
    return {name: str(getattr(importlib.import_module(module_name(name)), "COMPILER",
                              "its compiler"))
            for name in known_frameworks()}


def known_frameworks() -> list[str]:
    import pkgutil

    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def fresh(value: Any) -> Any:
    """A batch element as this step uses it: a callable gives fresh values every step."""
    return value() if callable(value) else value


def map_batch(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``leaf`` applied to every element of a nested batch: tuples (named ones too), lists and
    dicts are walked, anything else is a leaf (moving a batch to the device, in every
    adapter)."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(map_batch(v, leaf) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_batch(v, leaf) for v in value)
    if isinstance(value, dict):
        return {k: map_batch(v, leaf) for k, v in value.items()}
    return leaf(value)


def require_parameters(trainable: int, recipe: Callable[..., Any]) -> None:
    """A model with nothing to train is the recipe's mistake: say so, before the framework
    fails on it its own way (DDP: "DistributedDataParallel is not needed when a module doesn't
    have any parameter that requires a gradient"; an optimizer: "empty parameter list")."""
    if trainable > 0:
        return
    name = f"{getattr(recipe, '__module__', '?')}:{getattr(recipe, '__qualname__', recipe)}"
    raise WorkloadError(f"the recipe {name} returned a model with no trainable parameters: "
                        "there is nothing to train or to all-reduce; return the model whose "
                        "training step you measure (its parameters require gradients)")


class Batches:
    """A workload's own input pipeline (``Parts.data``): its ``(inputs, targets)`` batches one
    after the other, started again at its end (an epoch ended; a DataLoader re-shuffles)."""

    def __init__(self, source: Iterable[Any]) -> None:
        self._source = source
        self._batches: Iterator[Any] = iter(source)

    def next(self) -> tuple[Any, Any]:
        try:
            batch = next(self._batches)
        except StopIteration:
            self._batches = iter(self._source)
            batch = next(self._batches)
        inputs, targets = batch
        return inputs, targets
