"""The layout axis on the pytest side: which layouts a test runs under (``--dlperf-layouts``,
else its ``layouts`` marker, else plain data parallelism), on which of the ladder's topologies
each resolves, and the case ids they give (``1n2d-fsdp2``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from ..core.parallel import Layout, LayoutError, LayoutSpelling, parse_layout
from ..core.topology import Topology

MARKER = "layouts"


def wanted(metafunc: pytest.Metafunc, named: Mapping[str, object]) -> bool:
    """Whether the plugin parametrizes this test's ``layout``: a perf case that asks for the
    fixture (which needs ``cluster``), not a test whose own parameter is called so."""
    if "layout" not in named or "cluster" not in metafunc.fixturenames:
        return False
    return not any("layout" in _argnames(marker)
                   for marker in metafunc.definition.iter_markers("parametrize"))


def _argnames(marker: pytest.Mark) -> list[str]:
    names = marker.args[0] if marker.args else marker.kwargs.get("argnames", "")
    if isinstance(names, str):
        return [name.strip() for name in names.split(",")]
    return [str(name) for name in names]


def asked(definition: pytest.Item, option: Sequence[str] | None) -> list[LayoutSpelling]:
    """The spellings a test that takes ``layout`` runs under; a usage error naming the test
    and the marker where one cannot be read."""
    if option is not None:
        return [parse_layout(text) for text in option]
    marker = definition.get_closest_marker(MARKER)
    if marker is None:
        return [parse_layout("dp")]
    if marker.kwargs or not marker.args or not all(isinstance(a, str) for a in marker.args):
        raise pytest.UsageError(
            f"pytest-dlperf: {definition.nodeid}: @pytest.mark.layouts(...) takes layouts as "
            f"strings, e.g. @pytest.mark.layouts(\"dp\", \"fsdp\", \"tp2\"); got "
            f"args={marker.args!r} kwargs={marker.kwargs!r}")
    spellings = []
    for text in dict.fromkeys(a.strip().lower() for a in marker.args):
        try:
            spellings.append(parse_layout(text))
        except LayoutError as exc:
            raise pytest.UsageError(f"pytest-dlperf: {definition.nodeid}: "
                                    f"@pytest.mark.layouts: {exc}") from None
    return spellings


def pairs(nodeid: str, topologies: Sequence[Topology], spellings: Sequence[LayoutSpelling]
          ) -> list[tuple[Topology, LayoutSpelling, str]]:
    """(topology, spelling, id) for every layout on every topology whose ranks it divides;
    a usage error for a layout that divides none of them."""
    out = []
    for spelling in spellings:
        fits = []
        for topology in topologies:
            try:
                layout = spelling.resolve(topology.world_size)
            except LayoutError:
                continue
            fits.append((topology, spelling, case_id(topology, layout)))
        if not fits:
            worlds = ", ".join(f"{t.id} ({t.world_size})" for t in topologies)
            raise pytest.UsageError(
                f"pytest-dlperf: {nodeid}: layout {spelling.text!r} divides none of this "
                f"test's topologies' ranks ({worlds}): choose degrees whose product divides "
                "one (--dlperf-layouts or @pytest.mark.layouts), or more devices "
                "(--devices-per-node, --nodes)")
        out.extend(fits)
    return out


def case_id(topology: Topology, layout: Layout) -> str:
    """``1n2d`` for plain data parallelism (ids as before layouts), else ``1n2d-fsdp2``."""
    return f"{topology.id}-{layout.id}" if layout.id else topology.id


def resolved(nodeid: str, spelling: LayoutSpelling, world_size: int) -> Layout:
    try:
        return spelling.resolve(world_size)
    except LayoutError as exc:
        raise pytest.UsageError(f"pytest-dlperf: {nodeid}: {exc}") from None
