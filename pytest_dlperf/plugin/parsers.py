"""The parsers of the plugin's option values (``options.OPTIONS``): each takes the raw text
(from the command line, the environment or an ini file) and returns the value or raises
``ValueError`` saying what was expected; the settings name where the value came from."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..core.parallel import LayoutError, parse_layout
from ..core.sweep import SweepError, parse_options, parse_value


def _int(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise ValueError(f"expected an integer >= {minimum}") from None
        if value < minimum:
            raise ValueError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def _number_or_percent(raw: str, example: str) -> float:
    """``0.05`` or ``5%`` as 0.05; ``example`` says what was expected."""
    text = str(raw).strip()
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"expected {example}") from None


def parse_fraction(raw: str) -> float:
    value = _number_or_percent(raw, "a fraction like 0.05 or a percentage like 5%")
    if not 0 <= value < 1:
        raise ValueError(f"expected a fraction in [0, 1) (0.05 = 5%), got {value}")
    return value


def parse_cv(raw: str) -> float:
    """A coefficient of variation: like a fraction, but not bounded by 1 (n samples can vary by
    up to sqrt(n) x their mean)."""
    value = _number_or_percent(raw, "a coefficient of variation like 0.10 or 10%")
    if not 0 <= value < float("inf"):
        raise ValueError(f"expected a finite coefficient of variation >= 0 (0.10 = 10%), "
                         f"got {value}")
    return value


def _batch_size(raw: str) -> int | str:
    if str(raw).strip().lower() == "max":
        return "max"
    try:
        return _int(1)(raw)
    except ValueError:
        raise ValueError(f"expected a positive integer or 'max', got {raw!r}") from None


def _positive_float(raw: str) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ValueError("expected a number of seconds") from None
    if value <= 0:
        raise ValueError(f"expected a number of seconds > 0, got {value}")
    return value


def _bool(raw: str | bool) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = str(raw).strip()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


def _subset(*choices: str) -> Callable[[str], tuple[str, ...]]:
    def parse(raw: str) -> tuple[str, ...]:
        values = tuple(dict.fromkeys(v.strip() for v in str(raw).split(",") if v.strip()))
        if not values or any(v not in choices for v in values):
            raise ValueError(f"expected a comma-separated list of {', '.join(choices)}")
        return values

    return parse


def _path(raw: str) -> str:
    if not str(raw).strip():
        raise ValueError("expected a path")
    return str(raw)


def _pvalue(raw: str) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ValueError("expected a p-value like 0.001") from None
    if not 0 < value < 1:
        raise ValueError(f"expected a p-value between 0 and 1 (exclusive), got {value}")
    return value


def _history(raw: str) -> str:
    text = str(raw).strip()
    if not text:
        raise ValueError("expected a path (an SQLite file, .dlperf/history.db) or a "
                         "postgresql:// URL")
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if not scheme.startswith(("postgresql", "postgres", "sqlite")):
            raise ValueError(f"a {scheme}:// URL is not a store this knows: give a path (an "
                             "SQLite file) or a postgresql:// URL")
    return text


def parse_pythons(raw: str) -> dict[str, str]:
    """``oneflow=/opt/of/bin/python,foo=...`` -> {framework: interpreter path}."""
    pythons: dict[str, str] = {}
    for item in (part.strip() for part in str(raw).split(",")):
        if not item:
            continue
        name, sep, path = item.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise ValueError(f"expected FRAMEWORK=PATH (comma-separated pairs), got {item!r}")
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"{name!r} is not a framework name (like oneflow)")
        if name in pythons:
            raise ValueError(f"{name} is given twice")
        pythons[name] = path
    if not pythons:
        raise ValueError("expected FRAMEWORK=PATH, like oneflow=.venv-oneflow/bin/dlperf-python")
    return pythons


def _machine_name(raw: str) -> str:
    value = str(raw).strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
        raise ValueError("expected a name of letters, digits, '.', '_' and '-' (at most 64, "
                         f"starting with a letter or digit), got {value!r}")
    return value


def _link(raw: str) -> Any:
    from ..core.link import Link

    return Link.parse(raw)


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    return lambda raw: None if raw in (None, "") else parse(raw)


def _revision(raw: str) -> str:
    text = str(raw).strip()
    if not text or any(c.isspace() for c in text) or text.startswith("-"):
        raise ValueError(f"expected a git revision (a commit, branch or tag: main, HEAD~1, "
                         f"v1.2), got {raw!r}")
    return text


def parse_layouts(raw: str) -> tuple[str, ...]:
    """Comma-separated layout spellings (``dp,fsdp,fsdp2xtp2``), each checked."""
    values = tuple(dict.fromkeys(v.strip().lower() for v in str(raw).split(",") if v.strip()))
    if not values:
        raise ValueError("expected a comma-separated list of layouts such as dp,fsdp,tp,pp")
    for value in values:
        try:
            parse_layout(value)
        except LayoutError as exc:
            raise ValueError(str(exc)) from None
    return values


def parse_sweeps(raw: str) -> dict[str, tuple[int, ...]]:
    """``--dlperf-sweep``: ``NAME=LADDER`` per size (core.sweep)."""
    try:
        return parse_options(raw)
    except SweepError as exc:
        raise ValueError(str(exc)) from None


def parse_sizes(raw: str) -> dict[str, int | str]:
    """``--dlperf-size``: ``NAME=COUNT`` or ``NAME=max`` per size (``vocab=1M,num_classes=max``)."""
    sizes: dict[str, int | str] = {}
    for item in (part.strip() for part in str(raw).split(",")):
        if not item:
            continue
        name, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not name.isidentifier() or not value:
            raise ValueError(f"expected NAME=COUNT or NAME=max, a workload's size (vocab=1M, "
                             f"num_classes=max), got {item!r}")
        if name in sizes:
            raise ValueError(f"{name} is given twice")
        if value.lower() == "max":
            sizes[name] = "max"
            continue
        try:
            sizes[name] = parse_value(value)
        except SweepError as exc:
            raise ValueError(f"{name}: {exc}") from None
    searched = [name for name, value in sizes.items() if value == "max"]
    if len(searched) > 1:
        raise ValueError(f"{' and '.join(searched)} are both max: one size is searched at a time")
    if not sizes:
        raise ValueError("expected NAME=COUNT or NAME=max, like vocab=max")
    return sizes
