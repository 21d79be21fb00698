"""The one record a training rank receives: built once on the pytest side, written as JSON,
parsed once in the rank. Standard library only (ranks may run under another Python).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .allocator import Allocator
from .parallel import Layout
from .protocol import Protocol
from .recipes import RecipeReference, recipe_reference
from .workload import (
    AdamW,
    BuildContext,
    CaseWorkload,
    Optimizer,
    Precision,
    SizeValue,
    Workload,
)


class SpecError(ValueError):
    """A spec file a rank cannot use; names the field."""


@dataclass(frozen=True)
class PrecisionSpec:
    """The precision as the rank applies it (``Precision`` decided it on the pytest side)."""

    name: str = "fp32"  # "fp32" | "amp"
    dtype: str = "float32"  # autocast dtype: "float32" | "float16" | "bfloat16"
    loss_scaling: bool = False

    @property
    def enabled(self) -> bool:
        return self.name == "amp"

    @classmethod
    def of(cls, precision: Precision) -> PrecisionSpec:
        return cls(precision.name, precision.dtype, precision.loss_scaling)


@dataclass(frozen=True)
class OptimizerSpec:
    """The workload's optimizer as the rank builds it, the learning rate resolved."""

    lr: float
    momentum: float = 0.0  # sgd
    weight_decay: float = 0.0
    kind: str = "sgd"  # "sgd" | "adamw"
    betas: tuple[float, float] = (0.9, 0.999)  # adamw
    eps: float = 1e-8  # adamw
    no_decay_1d: bool = False  # no weight decay on 1-D parameters (biases, norm scales)
    clip_norm: float | None = None  # clip the global gradient norm to this

    @classmethod
    def of(cls, optimizer: Optimizer, global_batch: int) -> OptimizerSpec:
        if isinstance(optimizer, AdamW):
            return cls(lr=optimizer.lr, weight_decay=optimizer.weight_decay, kind="adamw",
                       betas=(float(optimizer.betas[0]), float(optimizer.betas[1])),
                       eps=optimizer.eps, no_decay_1d=optimizer.no_decay_1d,
                       clip_norm=optimizer.clip_norm)
        return cls(lr=optimizer.lr(global_batch), momentum=optimizer.momentum,
                   weight_decay=optimizer.weight_decay, clip_norm=optimizer.clip_norm)

    def for_batch_ratio(self, ratio: float) -> OptimizerSpec:
        """The optimizer for a global batch ``ratio`` times this one's: SGD's learning rate
        scales with the batch (linear scaling rule), AdamW's is fixed."""
        return replace(self, lr=self.lr * ratio) if self.kind == "sgd" else self

    def decays(self, shape: Any) -> bool:
        """Whether weight decay applies to a parameter of this shape."""
        return not (self.no_decay_1d and len(tuple(shape)) <= 1)


@dataclass(frozen=True)
class RankSpec:
    framework: str  # built-in adapter name, or the module (path) of the user's own adapter
    model: str  # the workload's name
    protocol: Protocol
    batch_size: int  # per device
    optimizer: OptimizerSpec
    recipe: RecipeReference | None = None  # None: the adapter trains without one
    sizes: dict[str, SizeValue] = field(default_factory=dict)
    unit: str = "samples"
    precision: PrecisionSpec = PrecisionSpec()
    compiler: str = "eager"
    seed: int = 0
    # Filled in by the cluster at launch:
    device_type: str = "cpu"
    threads: int = 1
    python: str | None = None  # the interpreter the ranks run under; None: pytest's
    workers: list[str] | None = None  # TensorFlow: every rank's host:port, when known upfront
    count_flops: bool = False  # rank 0 counts the torch recipe's FLOPs after its windows
    memory_limit: int | None = None  # bytes per rank, enforced by the OS (--dlperf-memory-limit)
    progress: str | None = None  # rank 0 appends its phases to this file (live progress)
    # The folder a user's own adapter module is imported from (None: built-in or installed).
    adapter_path: str | None = None
    # Duet A/B (--dlperf-ab-mode duet): the cores this side's ranks run on (each rank its
    # share, in local-rank order; ``threads`` is then the side's), the GPUs it sees (entries of
    # CUDA_VISIBLE_DEVICES), and the folder both sides' ``barrier_parties`` ranks meet at before
    # each timed window (``rank.barrier``), waiting ``barrier_timeout_s`` at most.
    cpus: list[int] | None = None
    visible_devices: list[str] | None = None
    barrier: str | None = None
    barrier_parties: int = 0
    barrier_timeout_s: float = 600.0
    # How the ranks share the work (pytest_dlperf.core.parallel.Layout.to_json()); None:
    # plain data parallelism over the world, as before layouts.
    layout: dict[str, Any] | None = None
    units_per_sample: int = 1  # units (tokens) of one sample; throughput counts units
    # Diagnostic steps after the timed windows, the step cut into phases (rank.phases);
    # 0: none (--dlperf-phases off).
    phase_steps: int = 0
    # The heap allocator the ranks start under (set by the launcher, checked by the rank);
    # None: whatever the launcher's environment gives.
    allocator: Allocator | None = None
    # Folders the launcher puts first on the ranks' PYTHONPATH, and the folder it starts them
    # in (None: pytest's): an A/B side's own tree (``core.sources``; ``python -m`` puts the
    # working folder first on the path). Launch-only, never in the rank's file.
    import_paths: list[str] | None = None
    cwd: str | None = None
    expected_imports: list[str] | None = None  # modules the ranks say where they came from

    def parallel(self, world_size: int) -> Layout:
        """The case's layout on ``world_size`` ranks (plain data parallelism where none)."""
        if self.layout is None:
            return Layout(dp=world_size)
        return Layout.from_json(self.layout)

    @property
    def compiled(self) -> bool:
        return self.compiler == "compiled"

    def context(self, rank: int, world_size: int, local_rank: int, device: str,
                mesh: Any = None) -> BuildContext:
        layout = self.parallel(world_size)
        return BuildContext(
            framework=self.framework, device_type=self.device_type, device=device,
            batch_size=self.batch_size, sizes=dict(self.sizes), precision=self.precision.name,
            amp_dtype=self.precision.dtype, compiled=self.compiled, seed=self.seed, rank=rank,
            world_size=world_size, local_rank=local_rank,
            layout=None if layout.is_data_parallel else layout, mesh=mesh)

    def with_(self, **changes: Any) -> RankSpec:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls, data: Any) -> RankSpec:
        if not isinstance(data, dict):
            raise SpecError(f"a rank spec must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"rank spec: unknown field(s) {', '.join(unknown)} (known: "
                            f"{', '.join(sorted(known))}); was it written by another version "
                            "of pytest-dlperf?")
        values = dict(data)
        try:
            values["protocol"] = Protocol(**values["protocol"])
            optimizer = dict(values["optimizer"])
            if "betas" in optimizer:  # a JSON list
                optimizer["betas"] = tuple(optimizer["betas"])
            values["optimizer"] = OptimizerSpec(**optimizer)
            if values.get("recipe") is not None:
                values["recipe"] = RecipeReference(**values["recipe"])
            if "precision" in values:
                values["precision"] = PrecisionSpec(**values["precision"])
            values["allocator"] = Allocator.from_json(values.get("allocator"))
            return cls(**values)
        except (KeyError, TypeError) as exc:
            raise SpecError(f"rank spec: missing or malformed field ({exc})") from None


# What only the launcher reads: the file a rank reads leaves it out (``rank_facing``).
LAUNCH_ONLY = ("import_paths", "cwd", "expected_imports")


def rank_facing(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as a rank's file holds it: without what only the launcher reads, and without
    the fields left empty at their defaults (None, off, none), so that another version's rank
    side (an A/B base of this plugin's own repository) reads a newer spec wherever the case
    uses nothing it lacks."""
    defaults = _defaults()
    return {key: value for key, value in spec.items()
            if key not in LAUNCH_ONLY
            and not (key in defaults and defaults[key] == value and not value)}


def _defaults() -> dict[str, Any]:
    """The JSON of every ``RankSpec`` field that has a default."""
    from dataclasses import MISSING

    found: dict[str, Any] = {}
    for f in fields(RankSpec):
        if f.default is not MISSING:
            value = f.default
        elif f.default_factory is not MISSING:
            value = f.default_factory()
        else:
            continue
        found[f.name] = json.loads(json.dumps(asdict(value) if hasattr(
            value, "__dataclass_fields__") else value))
    return found


def spec_for(framework: str, workload: Workload, *, protocol: Protocol, device_type: str,
             precision: str = "fp32", compiler: str = "eager", world_size: int = 1,
             batch_size: int | None = None, sizes: dict[str, SizeValue] | None = None,
             recipe: RecipeReference | None = None, recipe_key: str | None = None,
             layout: Layout | None = None) -> RankSpec:
    """The rank spec of ``workload`` on ``framework``: sized for the device type and precision
    (``batch_size``/``sizes`` override), the learning rate scaled to the global batch. The
    recipe is ``recipe``, else the workload's for ``recipe_key`` (default: the framework)."""
    sized = CaseWorkload.of(workload, device_type, precision, batch_size, sizes)
    layout = layout or Layout(dp=world_size)
    if recipe is None:
        key = recipe_key or framework
        if key in workload.recipes:
            recipe = recipe_reference(workload.recipes[key],
                                      f"workload {workload.name!r}, {key} recipe")
    return RankSpec(
        framework=framework, model=sized.model, protocol=protocol, batch_size=sized.batch_size,
        sizes=dict(sized.sizes), unit=sized.unit,
        optimizer=OptimizerSpec.of(workload.optimizer, layout.global_batch(sized.batch_size)),
        recipe=recipe, precision=PrecisionSpec.of(Precision(precision, device_type)),
        compiler=compiler, seed=workload.seed, device_type=device_type,
        layout=None if layout.is_data_parallel else layout.to_json(),
        units_per_sample=sized.units_per_sample)
