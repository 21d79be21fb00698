"""What a case trains: the public workload API.

A ``Workload`` names a model and says, per framework, which function builds it (a *recipe*), and
how big it is: the per-device batch per device type, the sizes that define it (image size,
sequence length, ...), the sample unit and the optimizer's hyper-parameters. The recipe runs
inside every training rank and returns ``Parts``: the model, one synthetic batch (or an iterator
of real batches) and optionally a loss. Everything else is the plugin's: process group,
data-parallel wrapper, device placement, AMP, the compiler axis, seeding, the timed windows and
their synchronization, the loss check, baselines and the verdict.

Ranks import a recipe by module path (``module:function``), so it must be a module-level
function of an importable module; ``recipe_reference`` refuses anything else before launch. This
module is imported in the ranks and by users' test files: standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# A size or batch either is a value, or maps device types to values: {"cuda": 224, "cpu": 64}.
# "<device>/amp" keys override for AMP cases: {"cuda": 128, "cuda/amp": 256, "cpu": 2}.
PerDevice = int | Mapping[str, int]
SizeValue = int | float | str | bool
Recipe = Callable[["BuildContext"], "Parts"] | str

DEVICE_TYPES = ("cuda", "cpu")
# Fingerprint fields a size may not shadow: the fingerprint is one flat record.
RESERVED_SIZES = frozenset({
    "device_type", "device_model", "nodes", "devices_per_node", "framework",
    "framework_version", "precision", "model", "batch_size", "protocol", "python",
    "threads_per_worker", "accelerator_stack", "compiler", "unit", "layout"})


class WorkloadError(ValueError):
    """A workload that cannot be run as given; the message says what to change."""


@dataclass(frozen=True)
class SGD:
    """SGD with momentum and coupled L2 weight decay (torch's ``weight_decay``), as DLPerf's
    ResNet-50 scripts. The learning rate follows the linear scaling rule: ``lr_per_256`` per 256
    samples of global batch (a tiny CPU batch at ImageNet's rate blows the loss up)."""

    lr_per_256: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    clip_norm: float | None = None  # global gradient norm clipped to this; None: no clipping

    def __post_init__(self) -> None:
        _check_optimizer(self, "SGD")

    def lr(self, global_batch: int) -> float:
        return self.lr_per_256 * global_batch / 256


@dataclass(frozen=True)
class AdamW:
    """Adam with decoupled weight decay (torch's ``AdamW``, Keras' ``AdamW``, OneFlow's
    ``AdamW``: bias-corrected), as BERT's pretraining. A fixed learning rate (not scaled with
    the batch). ``no_decay_1d``: no decay on 1-D parameters (biases and normalization scales,
    BERT's "not on LayerNorm and bias", decided by shape so that it means the same in every
    framework). ``clip_norm``: the global gradient norm (over all parameters, after the
    data-parallel all-reduce) is clipped to it before the update; None: no clipping."""

    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    no_decay_1d: bool = True
    clip_norm: float | None = None

    def __post_init__(self) -> None:
        _check_optimizer(self, "AdamW")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise WorkloadError(f"AdamW betas must be two numbers in [0, 1), got {self.betas!r}")


Optimizer = SGD | AdamW


def _check_optimizer(opt: Any, what: str) -> None:
    lr = opt.lr_per_256 if isinstance(opt, SGD) else opt.lr
    if not lr > 0:
        raise WorkloadError(f"{what}: the learning rate must be > 0, got {lr!r}")
    if opt.weight_decay < 0:
        raise WorkloadError(f"{what}: weight_decay must be >= 0, got {opt.weight_decay!r}")
    if opt.clip_norm is not None and not opt.clip_norm > 0:
        raise WorkloadError(f"{what}: clip_norm must be > 0 (or None for no clipping), got "
                            f"{opt.clip_norm!r}")


@dataclass(frozen=True)
class Workload:
    """A model as a perf case trains it. ``recipes`` maps a framework (an adapter's name, or the
    key a user's own adapter builds from: its ``RECIPE_FOR``) to its recipe: a module-level
    function ``recipe(ctx: BuildContext) -> Parts``, or its ``"module:function"`` path."""

    name: str
    recipes: Mapping[str, Recipe]
    batch_size: PerDevice = field(default_factory=lambda: {"cuda": 64, "cpu": 8})
    sizes: Mapping[str, SizeValue | Mapping[str, SizeValue]] = field(default_factory=dict)
    unit: str = "samples"
    optimizer: Optimizer = SGD()
    seed: int = 0
    # FLOPs of one trained sample (forward and backward), where they are not to be counted
    # from the torch recipe (a workload without one, or a formula such as a language model's
    # 6N + 12LHQT a token): a number, or a function of the case's sizes returning
    # it (``def flops(sizes: Mapping[str, SizeValue]) -> float``), called on the pytest side.
    # None: counted (pytest_dlperf.rank.flops).
    flops_per_sample: float | Callable[[Mapping[str, SizeValue]], float] | None = None
    # How many units one sample holds: an int, or the name of one of ``sizes`` (a language
    # model's "seq_length"): throughput then reads units/s (``unit="tokens"``: tokens/s).
    units_per_sample: int | str = 1
    # The layout kinds (pytest_dlperf.core.parallel.KINDS) its recipes support: "dp" and
    # "fsdp" need nothing of a recipe; "tp" needs ``Parts.tp_plan`` (or a recipe that shards
    # itself), "pp" ``Parts.pipeline_split``. A case of another layout skips, saying so.
    layouts: tuple[str, ...] = ("dp", "fsdp")

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise WorkloadError(f"Workload name must be a non-empty string, got {self.name!r}")
        flops = self.flops_per_sample
        if flops is not None and not callable(flops) and (
                isinstance(flops, bool) or not isinstance(flops, (int, float))
                or not flops > 0):
            raise WorkloadError(f"workload {self.name!r}: flops_per_sample must be a positive "
                                f"number (FLOPs of one sample's forward and backward) or a "
                                f"function of the case's sizes returning one, got {flops!r}")
        if not self.recipes:
            raise WorkloadError(f"workload {self.name!r} has no recipes: give at least one, "
                                "e.g. recipes={'torch': build_my_model}")
        _check_units_per_sample(self)
        _check_layouts(self)
        shadowed = sorted(set(self.sizes) & RESERVED_SIZES)
        if shadowed:
            raise WorkloadError(
                f"workload {self.name!r}: size name(s) {', '.join(shadowed)} would shadow "
                "fingerprint fields of the same name; rename them (e.g. 'seq_length')")

    def batch_for(self, device_type: str, precision: str) -> int:
        return int(_per_device(self.batch_size, device_type, precision,
                               f"workload {self.name!r} batch_size"))

    def sizes_for(self, device_type: str, precision: str) -> dict[str, SizeValue]:
        return {name: _per_device(value, device_type, precision,
                                  f"workload {self.name!r} size {name!r}")
                for name, value in self.sizes.items()}


def _check_units_per_sample(workload: Workload) -> None:
    units = workload.units_per_sample
    if isinstance(units, str):
        if units not in workload.sizes:
            raise WorkloadError(
                f"workload {workload.name!r}: units_per_sample={units!r} names no size (its "
                f"sizes: {', '.join(sorted(workload.sizes)) or 'none'}); give an int, or the "
                "name of the size that holds it (a sequence length)")
        return
    if isinstance(units, bool) or not isinstance(units, int) or units < 1:
        raise WorkloadError(f"workload {workload.name!r}: units_per_sample must be a positive "
                            f"integer or the name of a size, got {units!r}")


def _check_layouts(workload: Workload) -> None:
    """The form of ``layouts`` (checked wherever the workload is made: a rank that imports the
    test's module too, where a kind of the user's need not be registered yet)."""
    layouts = workload.layouts
    if isinstance(layouts, str) or not all(isinstance(k, str) for k in layouts):
        raise WorkloadError(f"workload {workload.name!r}: layouts must be a tuple of layout "
                            f"kinds (dp, fsdp, tp, pp, or a registered kind's name), got "
                            f"{layouts!r}")
    if "dp" not in layouts:
        raise WorkloadError(f"workload {workload.name!r}: layouts {tuple(layouts)!r}: 'dp' "
                            "missing (every workload trains on one process)")


def unknown_kinds(workload: Workload) -> None:
    """A ``WorkloadError`` where ``layouts`` names a kind nobody registered (checked in pytest's
    process before a case runs, once the tests' conftest and modules have registered theirs)."""
    from .parallel import registered

    kinds = registered()
    unknown = sorted(set(workload.layouts) - set(kinds))
    if unknown:
        raise WorkloadError(f"workload {workload.name!r}: layouts {tuple(workload.layouts)!r}: "
                            f"unknown kind(s) {', '.join(unknown)}; the registered kinds are "
                            f"{', '.join(kinds)}")


@dataclass(frozen=True)
class CaseWorkload:
    """A workload as one case runs it: its name, unit and this case's concrete sizes."""

    model: str
    unit: str
    batch_size: int  # per device (per replica, under a layout that shards a replica)
    sizes: Mapping[str, SizeValue]
    units_per_sample: int = 1

    @classmethod
    def of(cls, workload: Workload, device_type: str, precision: str,
           batch_size: int | None = None,
           sizes: Mapping[str, SizeValue] | None = None) -> CaseWorkload:
        """Sized for a device type and precision; ``batch_size`` and ``sizes`` override."""
        resolved = workload.sizes_for(device_type, precision)
        unknown = sorted(set(sizes or {}) - set(resolved))
        if unknown:
            raise WorkloadError(
                f"workload {workload.name!r} has no size(s) {', '.join(unknown)} (its sizes: "
                f"{', '.join(sorted(resolved)) or 'none'})")
        resolved.update(sizes or {})
        batch = workload.batch_for(device_type, precision) if batch_size is None else batch_size
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise WorkloadError(f"workload {workload.name!r}: the per-device batch size must be "
                                f"a positive integer, got {batch!r}")
        units = workload.units_per_sample
        if isinstance(units, str):
            value = resolved[units]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"workload {workload.name!r}: units_per_sample names size "
                                    f"{units!r}, which is {value!r}: it must be a positive "
                                    "integer")
            units = value
        return cls(workload.name, _checked_unit(workload), batch, resolved, units)


def _checked_unit(workload: Workload) -> str:
    """The sample unit, as the tables, baselines and history show it ("399.2 images/s")."""
    unit = workload.unit
    if not isinstance(unit, str) or not unit.strip() or unit != unit.strip():
        raise WorkloadError(f"workload {workload.name!r}: unit must name what one sample is, "
                            "a word such as 'samples', 'images', 'sentences' or 'tokens' "
                            f"(the tables show it per second), got {unit!r}")
    if unit.endswith("/s"):
        raise WorkloadError(f"workload {workload.name!r}: unit {unit!r} names a rate; give "
                            f"what one sample is ({unit[:-2]!r}): the tables add the '/s'")
    return unit


def _per_device(value: Any, device_type: str, precision: str, what: str) -> Any:
    if not isinstance(value, Mapping):
        return value
    for key in (f"{device_type}/{precision}", device_type):
        if key in value:
            return value[key]
    raise WorkloadError(f"{what} has no value for {device_type} (keys: {', '.join(value)}); "
                        f"add a {device_type!r} entry")


@dataclass
class Parts:
    """What a recipe returns, built inside the rank (framework objects; the plugin places them).

    - ``model``: the network (torch/OneFlow ``nn.Module``, a Keras model built in the recipe:
      the plugin calls TensorFlow recipes under the distribution strategy's scope);
    - ``inputs`` / ``targets``: one synthetic batch of this rank's per-device size; the plugin
      keeps it resident on the device (``inputs`` may be a tuple: the model is called with it
      unpacked). Either may be a zero-argument callable instead, called every step (inside the
      compiled step in TensorFlow) for fresh values: random labels, so that a fixed batch is
      not memorized and reduced-precision runs do not end in NaN;
    - ``data``: instead of ``inputs``/``targets``, an iterable of ``(inputs, targets)`` batches
      (a ``DataLoader`` reading files, say) when the input pipeline is part of what is measured;
      each batch is moved to the device inside the timed step (every built-in adapter but
      TensorFlow's, which refuses it).
    - ``loss``: ``loss(outputs, targets) -> scalar``; default: cross-entropy of class logits
      against integer labels (``[B, C]`` against ``[B]``, or a language model's ``[B, T, V]``
      against ``[B, T]``: the mean over every token; of a library model's output object, its
      ``loss`` where the model computed one, else its ``logits``).

    Under a layout beyond data parallelism (``ctx.layout``), the recipe returns the whole,
    unsharded model and says how to cut it, a plan by kind in ``plans``; the adapter shards it:

    - ``plans["tp"]``: tensor parallelism's plan, module name -> the framework's style (torch:
      ``parallelize_module``'s plan of ``ColwiseParallel`` / ``RowwiseParallel`` ...), applied
      on the mesh's ``tp`` dimension;
    - ``plans["pp"]``: the names of the modules each pipeline stage after the first begins
      at (torch: ``SplitPoint.BEGINNING`` there), as many as stages - 1 (or more, a multiple,
      for interleaved schedules' virtual stages);
    - ``plans["fsdp"]``: the modules sharded as units of their own (each gathered for its own
      forward and backward), the root after them; default: every module of every
      ``ModuleList`` (a transformer's blocks);
    - a kind of your own's plan under its name (a table's sharding, a head's split), which its
      strategies read (``part.parts.plan("rep")``);
    - ``parallelized``: the recipe sharded the model itself on ``ctx.mesh``; the adapter then
      applies nothing (a recipe called with ``ctx.mesh`` None, as when its FLOPs are counted,
      must return the unsharded model).

    ``tp_plan``, ``pipeline_split`` and ``fsdp_units``, the plans' earlier names, still work for
    this release and warn (``FutureWarning``): give ``plans`` instead.
    """

    model: Any
    inputs: Any = None
    targets: Any = None
    loss: Callable[[Any, Any], Any] | None = None
    data: Iterable[Any] | None = None
    plans: Mapping[str, Any] | None = None
    tp_plan: Mapping[str, Any] | None = None  # deprecated: plans["tp"]
    pipeline_split: Sequence[str] | None = None  # deprecated: plans["pp"]
    fsdp_units: Sequence[str] | None = None  # deprecated: plans["fsdp"]
    parallelized: bool = False

    def plan(self, kind: str) -> Any:
        """The recipe's plan for ``kind`` (``plans``, else its deprecated field), or None."""
        if self.plans is not None and kind in self.plans:
            return self.plans[kind]
        legacy = _LEGACY_PLANS.get(kind)
        return getattr(self, legacy) if legacy else None

    def __post_init__(self) -> None:
        given = [kind for kind, name in _LEGACY_PLANS.items() if getattr(self, name) is not None]
        twice = [kind for kind in given if kind in (self.plans or {})]
        if twice:
            raise WorkloadError(f"the recipe's Parts gives the {twice[0]} plan twice, as "
                                f"plans[{twice[0]!r}] and as {_LEGACY_PLANS[twice[0]]}; give "
                                "plans only")
        if given:
            import warnings

            old = ", ".join(f"{_LEGACY_PLANS[k]}=..." for k in given)
            new = ", ".join(f"{k!r}: ..." for k in given)
            warnings.warn(f"Parts({old}) is deprecated and goes in the next release: give "
                          f"Parts(plans={{{new}}})", FutureWarning, stacklevel=3)
        if self.data is None and self.inputs is None:
            raise WorkloadError("the recipe's Parts has neither inputs (a synthetic batch) nor "
                                "data (an iterable of (inputs, targets) batches); give one")
        if self.data is not None and self.inputs is not None:
            raise WorkloadError("the recipe's Parts has both inputs and data; give one: inputs "
                                "for a synthetic batch resident on the device, data to measure "
                                "an input pipeline")


# The plans' earlier names, by kind (Parts.plan reads them for one more release).
_LEGACY_PLANS = {"tp": "tp_plan", "pp": "pipeline_split", "fsdp": "fsdp_units"}


@dataclass(frozen=True)
class BuildContext:
    """What a recipe is told, inside its rank."""

    framework: str
    device_type: str  # "cuda" | "cpu"
    device: str  # "cuda:<local rank>" or "cpu"
    batch_size: int  # per device
    sizes: Mapping[str, SizeValue]
    precision: str  # "fp32" | "amp"
    amp_dtype: str  # "float32" | "float16" | "bfloat16"
    compiled: bool
    seed: int
    rank: int
    world_size: int
    local_rank: int
    # How the ranks share the work (pytest_dlperf.core.parallel.Layout; plain data
    # parallelism: None) and the framework's device mesh for it (torch: a DeviceMesh with
    # named dimensions "pp", "dp", "fsdp", "tp" of more than one rank); None where the recipe
    # is called outside the job (FLOPs counting) or the layout is plain data parallelism.
    layout: Any = None
    mesh: Any = None


@dataclass(frozen=True)
class Precision:
    """The ``amp`` axis, decided here and nowhere else: AMP is fp16 autocast with loss scaling on
    CUDA and bf16 autocast on CPU (bf16 keeps fp32's exponent range, so it needs no scaler)."""

    name: str  # "fp32" | "amp": what the case ids and baselines say
    device_type: str

    @property
    def enabled(self) -> bool:
        return self.name == "amp"

    @property
    def dtype(self) -> str:
        if not self.enabled:
            return "float32"
        return "float16" if self.device_type == "cuda" else "bfloat16"

    @property
    def loss_scaling(self) -> bool:
        return self.enabled and self.device_type == "cuda"

    @property
    def label(self) -> str:
        return f"amp({self.dtype})" if self.enabled else "fp32"


PRECISIONS = ("fp32", "amp")
# The compiler axis, in words every framework shares (case ids line up across frameworks):
# "compiled" is each adapter's compiler (its COMPILER: pytest_dlperf.frameworks.compilers()).
COMPILERS = ("eager", "compiled")
