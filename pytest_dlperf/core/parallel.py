"""How a case's ranks share the work: its *layout*, one idea in one place.

A layout is a product of degrees over the world's ranks, one per kind (``kinds``: registered
entries; a kind of a user's, or of a later issue, registers the same way). The built-in four:
replicated data parallelism
(``dp``: DDP, every rank a whole model and an all-reduce of gradients), sharded data parallelism
(``fsdp``: FSDP2 / ZeRO-3, parameters, gradients and optimizer state sharded over the ranks,
gathered for each block's forward and backward), tensor parallelism (``tp``: each layer's
matrices split over the ranks, Megatron-style) and pipeline parallelism (``pp``: consecutive
blocks on consecutive stages, a batch cut into micro-batches that flow through them under a
schedule). The data-parallel ranks (``dp x fsdp``, and any kind registered with ``data``) each
train on their own batch of the case's per-replica size; tensor- and pipeline-parallel ranks of
one replica share theirs.

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .kinds import (
    BUILT_IN,
    DEFAULT_SCHEDULE,
    KINDS,
    MESH_ORDER,
    SCHEDULES,
    Kind,
    LayoutError,
    carried,
    kind_of,
    mesh_order,
    register_kind,
    registered,
    unregister_kind,
)
from .kinds.registry import _KINDS

__all__ = ["BUILT_IN", "DATA_PARALLEL", "DEFAULT_SCHEDULE", "KINDS", "MESH_ORDER", "SCHEDULES",
           "Kind", "Layout", "LayoutError", "LayoutSpelling", "kind_of", "mesh_order",
           "parse_layout", "register_kind", "registered", "unregister_kind"]

# -- a layout: degrees by kind ----------------------------------------------------------------

@dataclass(frozen=True, init=False)
class Layout:
    """Resolved degrees of one case, by kind: the world is their product. The built-in kinds'
    degrees read as attributes (``layout.fsdp``), any kind's as ``layout.degree(name)``."""

    degrees: tuple[tuple[str, int], ...]  # the kinds whose degree is not 1, registration order
    schedule: str  # pipeline schedule (pp > 1 only)
    microbatches: int  # pipeline micro-batches per step; 0: two per stage
    # A layout asked for by name on one rank (``fsdp`` on 1n1d: FSDP's code on a mesh of one)
    # keeps its name, so that its id says what ran.
    named: tuple[str, ...]
    options: tuple[tuple[str, str], ...]  # (kind, option) as spelled, for kinds beyond pp's

    def __init__(self, dp: int = 1, fsdp: int = 1, tp: int = 1, pp: int = 1,
                 schedule: str = DEFAULT_SCHEDULE, microbatches: int = 0,
                 named: tuple[str, ...] = (), degrees: Mapping[str, int] | None = None,
                 options: tuple[tuple[str, str], ...] = ()) -> None:
        given = {"dp": dp, "fsdp": fsdp, "tp": tp, "pp": pp, **(degrees or {})}
        for name, value in given.items():
            kind_of(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LayoutError(f"layout: the {name} degree must be a positive integer, "
                                  f"got {value!r}")
        if schedule not in SCHEDULES:
            raise LayoutError(f"layout: unknown pipeline schedule {schedule!r} (known: "
                              f"{', '.join(SCHEDULES)})")
        for name in named:
            kind_of(name)
        set_ = object.__setattr__
        set_(self, "degrees", tuple((k, given[k]) for k in _KINDS if given.get(k, 1) != 1))
        set_(self, "schedule", schedule)
        set_(self, "microbatches", microbatches)
        set_(self, "named", tuple(named))
        set_(self, "options", tuple((k, str(o)) for k, o in options))

    def degree(self, kind: str) -> int:
        return dict(self.degrees).get(kind, 1)

    @property
    def dp(self) -> int:
        return self.degree("dp")

    @property
    def fsdp(self) -> int:
        return self.degree("fsdp")

    @property
    def tp(self) -> int:
        return self.degree("tp")

    @property
    def pp(self) -> int:
        return self.degree("pp")

    def options_of(self, kind: str) -> list[str]:
        """The options ``kind``'s term was spelled with (``["r0.1"]`` for ``pfc2-r0.1``)."""
        return [option for k, option in self.options if k == kind]

    # -- what follows from it -------------------------------------------------------------

    @property
    def world_size(self) -> int:
        size = 1
        for _, degree in self.degrees:
            size *= degree
        return size

    @property
    def data_parallel(self) -> int:
        """Ranks that train on batches of their own: the replicas of the model, sharded or
        not."""
        size = 1
        for name, degree in self.degrees:
            size *= degree if _KINDS[name].data else 1
        return size

    def uses(self, kind: str) -> bool:
        """Whether the case runs ``kind``'s code: a degree above one, or named on one rank."""
        return self.degree(kind) > 1 or kind in self.named

    @property
    def is_data_parallel(self) -> bool:
        """Plain data parallelism (DDP, or one process): what every case was before layouts."""
        return not any(self.uses(kind) for kind in _KINDS if kind != "dp")

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

    def _dimensions(self) -> tuple[str, ...]:
        """The mesh's kinds, outermost first: the built-in ones always (as ranks were always
        told), another where this layout uses it."""
        return tuple(k for k in mesh_order() if k in BUILT_IN or self.uses(k))

    def mesh(self) -> list[tuple[str, int]]:
        """The device mesh's named dimensions of more than one rank, outermost first; empty
        for one process."""
        return [(kind, self.degree(kind)) for kind in mesh_order() if self.degree(kind) > 1]

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits on each dimension (row-major over the mesh order, the order
        ``init_device_mesh`` numbers ranks in)."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside a layout of {self.world_size} ranks")
        place: dict[str, int] = {}
        rest = rank
        dimensions = self._dimensions()
        for kind in reversed(dimensions):
            size = self.degree(kind)
            place[kind] = rest % size
            rest //= size
        return {kind: place[kind] for kind in dimensions}

    def data_rank(self, rank: int) -> int:
        """Which replica's batch ``rank`` trains on (0 .. data_parallel - 1): its place over the
        data kinds' dimensions, outermost first."""
        at = self.coordinates(rank)
        replica = 0
        for kind in self._dimensions():
            if _KINDS[kind].data:
                replica = replica * self.degree(kind) + at[kind]
        return replica

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds it uses beyond one process (``("fsdp", "tp")``); ``("dp",)`` for plain
        data parallelism, whatever its degree."""
        used = tuple(kind for kind in _KINDS if kind != "dp" and self.uses(kind))
        return used or ("dp",)

    @property
    def id(self) -> str:
        """The case id's part: empty for plain data parallelism (ids as before layouts), else
        the degrees, ``fsdp2``, ``dp2xtp2``, ``pp2-gpipe-mb4``."""
        if self.is_data_parallel:
            return ""
        terms = []
        for kind in _KINDS:
            degree = self.degree(kind)
            if degree == 1 and not self.uses(kind) or kind == "dp" and degree == 1:
                continue
            term = f"{kind}{degree}"
            if kind == "pp":
                if self.schedule != DEFAULT_SCHEDULE:
                    term += f"-{self.schedule}"
                if self.microbatches:
                    term += f"-mb{self.microbatches}"
            term += "".join(f"-{option}" for option in self.options_of(kind))
            terms.append(term)
        return "x".join(terms)

    def to_json(self) -> dict[str, Any]:
        """What ranks and results files read: the built-in degrees as fields (as always), other
        kinds' under ``degrees``, options where there are any."""
        data: dict[str, Any] = {"dp": self.dp, "fsdp": self.fsdp, "tp": self.tp, "pp": self.pp,
                                "schedule": self.schedule, "microbatches": self.microbatches,
                                "named": list(self.named)}
        others = {k: d for k, d in self.degrees if k not in BUILT_IN}
        others.update({k: 1 for k in self.named if k not in BUILT_IN and k not in others})
        if others:
            data["degrees"] = others
            data["kinds"] = {k: {"mesh_position": _KINDS[k].mesh_position,
                                 "data": _KINDS[k].data, "module": _KINDS[k].module,
                                 "path": _KINDS[k].path} for k in others}
        if self.options:
            data["options"] = [list(pair) for pair in self.options]
        return data

    @classmethod
    def from_json(cls, data: Any) -> Layout:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise LayoutError(f"a layout must be a JSON object, got {type(data).__name__}")
        known = {*BUILT_IN, "schedule", "microbatches", "named", "degrees", "options", "kinds"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LayoutError(f"layout: unknown field(s) {', '.join(unknown)}")
        values = dict(data)
        for name, entry in values.pop("kinds", {}).items():
            carried(name, entry["mesh_position"], entry["data"], entry.get("module", ""),
                    entry.get("path", ""))
        values["named"] = tuple(values.get("named", ()))
        values["options"] = tuple(tuple(pair) for pair in values.get("options", ()))
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
    options: tuple[tuple[str, str], ...] = ()  # (kind, option) of kinds beyond pp

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
        values = {"dp": 1}
        open_kinds = [kind for kind, degree in self.degrees if degree is None]
        for kind, degree in self.degrees:
            values[kind] = degree if degree is not None else rest
        if not open_kinds:
            values["dp"] *= rest
        named = tuple(kind for kind in self.kinds if kind != "dp")
        return Layout(degrees=values, schedule=self.schedule, microbatches=self.microbatches,
                      named=named, options=self.options)


_TERM = re.compile(r"^([a-wyz]+)(\d*)((?:-[a-z0-9.]+)*)$")


def _syntax() -> str:
    return (f"a layout is terms joined by 'x', each a registered kind ({', '.join(_KINDS)}) with "
            "an optional degree (fsdp2xtp2), a pipeline term with an optional schedule and "
            "micro-batches (pp2-gpipe-mb4)")


def parse_layout(text: str) -> LayoutSpelling:
    """``"fsdp2xtp2"`` -> its spelling; a ``LayoutError`` that says what is allowed."""
    if not isinstance(text, str) or not text.strip():
        raise LayoutError("an empty layout: give one such as dp, fsdp, tp, pp, fsdp2xtp2")
    text = text.strip().lower()
    degrees: list[tuple[str, int | None]] = []
    schedule, microbatches = DEFAULT_SCHEDULE, 0
    options: list[tuple[str, str]] = []
    for term in text.split("x"):
        match = _TERM.match(term)
        if not match and (not term or term.endswith("-")) and "-" in text:
            terms = ", ".join(repr(t) for t in text.split("x"))
            raise LayoutError(f"layout {text!r}: 'x' joins a layout's terms, so it was read as "
                              f"{terms}, and {term!r} is no term: an option cannot contain an "
                              f"x; {_syntax()}")
        if not match:
            raise LayoutError(f"layout {text!r}: cannot read {term!r}; {_syntax()}")
        kind, digits, spelled = match.groups()
        if kind not in _KINDS:
            raise LayoutError(f"layout {text!r}: cannot read {term!r}, no kind {kind!r} is "
                              f"registered; {_syntax()}")
        if kind in {k for k, _ in degrees}:
            raise LayoutError(f"layout {text!r} names {kind} twice")
        degree = int(digits) if digits else None
        if degree == 0:
            raise LayoutError(f"layout {text!r}: a degree must be at least 1 ({term!r})")
        check = _KINDS[kind].check_option
        for option in filter(None, spelled.split("-")):
            if check is None:
                takers = [k for k, entry in _KINDS.items() if entry.check_option and k != "pp"]
                raise LayoutError(f"layout {text!r}: only a pipeline term (pp)"
                                  + "".join(f" or a {k} term" for k in takers)
                                  + f" takes options, {term!r} has {option!r}")
            problem = check(option)
            if problem:
                raise LayoutError(f"layout {text!r}: unknown "
                                  f"{'pipeline' if kind == 'pp' else kind} option {option!r} "
                                  f"({problem})")
            if kind != "pp":
                options.append((kind, option))
            elif option in SCHEDULES:
                schedule = option
            else:
                microbatches = int(option[2:])
        degrees.append((kind, degree))
        named = [option for taker, option in options if taker == kind]
        if check is not None and _KINDS[kind].needs_option and len(named) != 1:
            raise LayoutError(f"layout {text!r}: an {kind} term takes one option, "
                              f"{kind}2-<option>, and {term!r} has "
                              f"{', '.join(named) or 'none'} ({check('')})")
        most = _KINDS[kind].max_options
        if most is not None and len(named) > most:
            raise LayoutError(f"layout {text!r}: a {kind} term takes at most {most} "
                              f"option{'s' if most > 1 else ''}, and {term!r} has "
                              f"{', '.join(named)}")
    if sum(degree is None for _, degree in degrees) > 1:
        raise LayoutError(f"layout {text!r} leaves more than one degree open; give all but one "
                          "a number (fsdpxtp2)")
    return LayoutSpelling(text, tuple(degrees), schedule, microbatches, tuple(options))


DATA_PARALLEL = Layout()
