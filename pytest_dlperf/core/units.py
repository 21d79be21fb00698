"""Sizes and rates as people write and read them: bytes (binary units) and FLOPs, parsed from
options and formatted for messages and tables. One place for each, so a figure reads the same in
a failure message, the summary table and the history's page."""

from __future__ import annotations


def parse_size(raw: str) -> int:
    """Bytes from ``1536M``, ``2G``, ``2GiB``, ``500000000`` (binary units: K/M/G/T are 1024^n)."""
    text = str(raw).strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError(f"expected a size like 2G, 1536M or a byte count, got {raw!r}") from None
    if value < 1 << 20:
        raise ValueError(f"a memory limit under 1 MiB cannot hold a Python process, got {raw!r}")
    return int(value)


def parse_flops(raw: str) -> float:
    """A FLOP/s figure: a number, optionally with a k/M/G/T/P suffix (989.4T)."""
    text = str(raw).strip()
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}.get(text[-1:].lower(), 1.0)
    number = text[:-1] if scale != 1.0 else text
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError("expected FLOP/s as a number, optionally with a k/M/G/T/P suffix "
                         "(989.4T)") from None
    if not value > 0:
        raise ValueError(f"expected a positive FLOP/s figure, got {raw!r}")
    return value


def format_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GiB", 2.0 ** 30), ("MiB", 2.0 ** 20), ("KiB", 2.0 ** 10)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} B"


def format_flops(value: float | None, per: str = "/s") -> str:
    """FLOP/s (or, ``per=""``, FLOPs) in the largest unit that keeps the figure at 1 or more."""
    if value is None:
        return "-"
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:,.1f} {prefix}FLOP{per}"
    return f"{value:,.0f} FLOP{per}"
