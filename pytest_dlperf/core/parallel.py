"""How a case's ranks share the work: its *layout*, one idea in one place.

A layout is the product of four degrees over the world's ranks: replicated data parallelism
(``dp``: DDP, every rank a whole model and an all-reduce of gradients), sharded data parallelism
(``fsdp``: FSDP2 / ZeRO-3, parameters, gradients and optimizer state sharded over the ranks,
gathered for each block's forward and backward), tensor parallelism (``tp``: each layer's
matrices split over the ranks, Megatron-style) and pipeline parallelism (``pp``: consecutive
blocks on consecutive stages, a batch cut into micro-batches that flow through them under a
schedule). The data-parallel ranks (``dp x fsdp``) each train on their own batch of the case's
per-replica size; tensor- and pipeline-parallel ranks of one replica share theirs.

Everything that used to multiply by the world size asks a layout instead: the global batch,
the units (tokens) per step, the learning rate's scaling, the live progress, the straggler check.
Spelling (``--dlperf-layouts``, the ``layouts`` marker, case ids): terms joined by ``x``, each a
kind and an optional degree: ``dp``, ``fsdp``, ``tp2``, ``pp2``, ``fsdp2xtp2``, ``dp2xpp2``. A term
without a degree takes the ranks the others leave (at most one may); terms with degrees that do
not fill the world leave the rest to ``dp``. A pipeline term may name its schedule and
micro-batches: ``pp2-gpipe``, ``pp2-1f1b-mb8``, ``pp2-interleaved1f1b`` (default ``1f1b``, two
micro-batches per stage). A case's id shows the resolved degrees (``1n2d-fsdp2``,
``1n4d-fsdp2xtp2``); a plain data-parallel case's id and fingerprint are what they always were.

Standard library only: ranks import it, under any Python 3.10+.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

KINDS = ("dp", "fsdp", "tp", "pp")
SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")
DEFAULT_SCHEDULE = "1f1b"
# The order of a mesh's dimensions, outermost first (torchtitan's: pipeline stages furthest
# apart, tensor parallelism within a node's fastest links).
MESH_ORDER = ("pp", "dp", "fsdp", "tp")

_TERM = re.compile(r"^(dp|fsdp|tp|pp)(\d*)((?:-[a-z0-9]+)*)$")


class LayoutError(ValueError):
    """A layout that cannot be spelled or does not fit the world; the message says which and
    what would."""


@dataclass(frozen=True)
class Layout:
    """Resolved degrees of one case: ``dp * fsdp * tp * pp`` ranks."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    schedule: str = DEFAULT_SCHEDULE  # pipeline schedule (pp > 1 only)
    microbatches: int = 0  # pipeline micro-batches per step; 0: two per stage
    # A layout asked for by name on one rank (``fsdp`` on 1n1d: FSDP's code on a mesh of one)
    # keeps its name, so that its id says what ran.
    named: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for kind in KINDS:
            value = getattr(self, kind)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LayoutError(f"layout: the {kind} degree must be a positive integer, "
                                  f"got {value!r}")
        if self.schedule not in SCHEDULES:
            raise LayoutError(f"layout: unknown pipeline schedule {self.schedule!r} (known: "
                              f"{', '.join(SCHEDULES)})")

    # -- what follows from it -------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.dp * self.fsdp * self.tp * self.pp

    @property
    def data_parallel(self) -> int:
        """Ranks that train on batches of their own: the replicas of the model, sharded or
        not."""
        return self.dp * self.fsdp

    def uses(self, kind: str) -> bool:
        """Whether the case runs ``kind``'s code: a degree above one, or named on one rank."""
        return getattr(self, kind) > 1 or kind in self.named

    @property
    def is_data_parallel(self) -> bool:
        """Plain data parallelism (DDP, or one process): what every case was before layouts."""
        return not any(self.uses(kind) for kind in ("fsdp", "tp", "pp"))

    @property
    def stage_microbatches(self) -> int:
        """The pipeline's micro-batches per step (1 without a pipeline)."""
        if self.pp == 1:
            return 1
        return self.microbatches or 2 * self.pp

    def global_batch(self, batch_per_replica: int) -> int:
        """Samples one optimizer step trains on, over the whole world."""
        return batch_per_replica * self.data_parallel

    def units_per_step(self, batch_per_replica: int, units_per_sample: int = 1) -> int:
        """Units (tokens of a language model, else samples) one step trains on."""
        return self.global_batch(batch_per_replica) * units_per_sample

    def mesh(self) -> list[tuple[str, int]]:
        """The device mesh's named dimensions of more than one rank, outermost first; empty
        for one process."""
        return [(kind, getattr(self, kind)) for kind in MESH_ORDER if getattr(self, kind) > 1]

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits on each dimension (row-major over ``MESH_ORDER``, the order
        ``init_device_mesh`` numbers ranks in)."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside a layout of {self.world_size} ranks")
        place: dict[str, int] = {}
        rest = rank
        for kind in reversed(MESH_ORDER):
            size = getattr(self, kind)
            place[kind] = rest % size
            rest //= size
        return {kind: place[kind] for kind in MESH_ORDER}

    def data_rank(self, rank: int) -> int:
        """Which replica's batch ``rank`` trains on (0 .. data_parallel - 1)."""
        at = self.coordinates(rank)
        return at["dp"] * self.fsdp + at["fsdp"]

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds it uses beyond one process (``("fsdp", "tp")``); ``("dp",)`` for plain
        data parallelism, whatever its degree."""
        used = tuple(kind for kind in KINDS if kind != "dp" and self.uses(kind))
        return used or ("dp",)

    @property
    def id(self) -> str:
        """The case id's part: empty for plain data parallelism (ids as before layouts), else
        the degrees, ``fsdp2``, ``dp2xtp2``, ``pp2-gpipe-mb4``."""
        if self.is_data_parallel:
            return ""
        terms = []
        for kind in KINDS:
            degree = getattr(self, kind)
            if degree == 1 and not self.uses(kind) or kind == "dp" and degree == 1:
                continue
            term = f"{kind}{degree}"
            if kind == "pp":
                if self.schedule != DEFAULT_SCHEDULE:
                    term += f"-{self.schedule}"
                if self.microbatches:
                    term += f"-mb{self.microbatches}"
            terms.append(term)
        return "x".join(terms)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["named"] = list(self.named)
        return data

    @classmethod
    def from_json(cls, data: Any) -> Layout:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise LayoutError(f"a layout must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LayoutError(f"layout: unknown field(s) {', '.join(unknown)}")
        values = dict(data)
        values["named"] = tuple(values.get("named", ()))
        return cls(**values)

    def fingerprint(self) -> dict[str, Any]:
        """What a baseline must match beyond the topology: nothing for plain data parallelism
        (fingerprints as before layouts), else the layout's id."""
        return {} if not self.id else {"layout": self.id}


@dataclass(frozen=True)
class LayoutSpelling:
    """A layout as written, before it meets a world size: kinds with degrees or None."""

    text: str
    degrees: tuple[tuple[str, int | None], ...]
    schedule: str = DEFAULT_SCHEDULE
    microbatches: int = 0

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind, _ in self.degrees)

    def resolve(self, world_size: int) -> Layout:
        """The degrees on ``world_size`` ranks; a ``LayoutError`` naming the layout where they
        do not divide it."""
        fixed = 1
        for _, degree in self.degrees:
            fixed *= degree or 1
        if world_size % fixed:
            raise LayoutError(f"layout {self.text!r} needs a multiple of {fixed} ranks and the "
                              f"case has {world_size}: choose degrees whose product divides "
                              "the world (nodes x devices per node)")
        rest = world_size // fixed
        values = {kind: 1 for kind in KINDS}
        open_kinds = [kind for kind, degree in self.degrees if degree is None]
        for kind, degree in self.degrees:
            values[kind] = degree if degree is not None else rest
        if not open_kinds:
            values["dp"] *= rest
        named = tuple(kind for kind in self.kinds if kind != "dp")
        return Layout(dp=values["dp"], fsdp=values["fsdp"], tp=values["tp"], pp=values["pp"],
                      schedule=self.schedule, microbatches=self.microbatches, named=named)


def parse_layout(text: str) -> LayoutSpelling:
    """``"fsdp2xtp2"`` -> its spelling; a ``LayoutError`` that says what is allowed."""
    if not isinstance(text, str) or not text.strip():
        raise LayoutError("an empty layout: give one such as dp, fsdp, tp, pp, fsdp2xtp2")
    text = text.strip().lower()
    degrees: list[tuple[str, int | None]] = []
    schedule, microbatches = DEFAULT_SCHEDULE, 0
    for term in text.split("x"):
        match = _TERM.match(term)
        if not match:
            raise LayoutError(
                f"layout {text!r}: cannot read {term!r}; a layout is terms joined by 'x', each "
                f"one of {', '.join(KINDS)} with an optional degree (fsdp2xtp2), a pipeline "
                "term with an optional schedule and micro-batches (pp2-gpipe-mb4)")
        kind, digits, options = match.groups()
        if kind in {k for k, _ in degrees}:
            raise LayoutError(f"layout {text!r} names {kind} twice")
        degree = int(digits) if digits else None
        if degree == 0:
            raise LayoutError(f"layout {text!r}: a degree must be at least 1 ({term!r})")
        for option in filter(None, options.split("-")):
            if kind != "pp":
                raise LayoutError(f"layout {text!r}: only a pipeline term (pp) takes options, "
                                  f"{term!r} has {option!r}")
            if option in SCHEDULES:
                schedule = option
            elif re.fullmatch(r"mb\d+", option) and int(option[2:]) > 0:
                microbatches = int(option[2:])
            else:
                raise LayoutError(f"layout {text!r}: unknown pipeline option {option!r} (a "
                                  f"schedule: {', '.join(SCHEDULES)}; micro-batches: mb<N>)")
        degrees.append((kind, degree))
    if sum(degree is None for _, degree in degrees) > 1:
        raise LayoutError(f"layout {text!r} leaves more than one degree open; give all but one "
                          "a number (fsdpxtp2)")
    return LayoutSpelling(text, tuple(degrees), schedule, microbatches)


DATA_PARALLEL = Layout()
