"""Framework adapters: one module per framework, each behind the same small interface.

A framework module (``frameworks/<name>.py``) defines, without importing the framework at module
level:

- ``DISTRIBUTION``: the package whose installed version enters the baseline fingerprint (or a
  tuple of packages that provide the framework, first installed wins);
- ``build_trainer(spec, dist) -> Trainer``: called inside each worker rank with the plain JSON
  spec and the rank's place in the job; it sets the framework's process group up itself.

Adding a framework is adding one such module; nothing else dispatches on framework names.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol


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


def exchange(dist: DistEnv, key: str, value: str, timeout_s: float = 600.0) -> list[str]:
    """Every rank's ``value`` for ``key``, in rank order, swapped through the key-value store of
    the torchrun agent that started this rank (its rendezvous store; every launch mode starts
    agents). For frameworks that need all peers' addresses before they start (TensorFlow's
    TF_CONFIG). torch is importable wherever torchrun is."""
    import os
    from datetime import timedelta

    import torch.distributed as torch_dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise RuntimeError("this rank was not started by a torchrun agent with a store "
                           "(TORCHELASTIC_USE_AGENT_STORE); give every rank's address in the spec")
    store = torch_dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                dist.world_size, is_master=False,
                                timeout=timedelta(seconds=timeout_s))
    store.set(f"dlperf/{key}/{dist.rank}", value)
    keys = [f"dlperf/{key}/{rank}" for rank in range(dist.world_size)]
    store.wait(keys, timedelta(seconds=timeout_s))
    return [store.get(k).decode() for k in keys]


def module_name(name: str) -> str:
    """``torch`` -> this package's adapter; a dotted name is the user's own adapter module."""
    return name if "." in name else f"{__name__}.{name}"


def load(name: str) -> ModuleType:
    """The adapter module for ``name``; a clear error when there is none."""
    target = module_name(name)
    try:
        found = all(part.isidentifier() for part in name.split(".")) and \
            importlib.util.find_spec(target) is not None
    except ModuleNotFoundError:  # the parent package of a dotted name is missing
        found = False
    if not found:
        known = ", ".join(known_frameworks()) or "none"
        raise LookupError(f"no framework adapter named {name!r} (known: {known}; or a dotted "
                          "module path to your own adapter)")
    return importlib.import_module(target)


def known_frameworks() -> list[str]:
    import pkgutil

    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def installed_version(name: str) -> str | None:
    """The framework's installed version, read from package metadata (no framework import).
    ``DISTRIBUTION`` may name several packages that provide it (first installed wins)."""
    distributions = load(name).DISTRIBUTION
    for distribution in (distributions,) if isinstance(distributions, str) else distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
