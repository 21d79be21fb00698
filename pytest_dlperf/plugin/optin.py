"""What a CPU's scaling ladder leaves to an opt-in: its AMP cases and its layouts beyond data
parallelism. The ladder (``@pytest.mark.multinode``, DLPerf's headline) measures how data
parallelism scales; on a CPU its bf16 cases take minutes each and its FSDP, tensor- and
pipeline-parallel rungs check layouts the test suite checks already, so the design card's first
command ran 36 cases and did not finish in 700 s on two cores (issue 74). Those cases stay collected (their ids are baselines' keys) and skip
saying which flag runs them; the run's summary counts them. Named flags run them:
``--dlperf-precisions fp32,amp``, ``--dlperf-layouts ...``.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..core.parallel import LayoutSpelling

# The cases left out, by what left them out: their node ids (a case is counted once).
LEFT_OUT = pytest.StashKey[dict[str, set[str]]]()
AMP, LAYOUTS = "AMP", "layouts beyond dp"
FLAGS = {AMP: "--dlperf-precisions fp32,amp", LAYOUTS: "--dlperf-layouts dp,fsdp,tp,pp"}


def _on_cpu_ladder(request: pytest.FixtureRequest, state: Any) -> bool:
    return (state.device_type == "cpu"
            and request.node.get_closest_marker("multinode") is not None)


def _leave_out(request: pytest.FixtureRequest, what: str, why: str) -> None:
    left = request.config.stash.setdefault(LEFT_OUT, {})
    if not any(request.node.nodeid in ids for ids in left.values()):
        left.setdefault(what, set()).add(request.node.nodeid)
    pytest.skip(f"on a CPU the scaling ladder runs fp32 under data parallelism; {why}: "
                f"{FLAGS[what]} runs it")


def amp_case(request: pytest.FixtureRequest, state: Any, name: str) -> None:
    """Skip an AMP case of a CPU's scaling ladder unless the precisions were named."""
    if name == "amp" and state.settings.precisions is None and _on_cpu_ladder(request, state):
        _leave_out(request, AMP, "its AMP cases are opt-in (bf16 on CPU ranks: minutes a case)")


def layout_case(request: pytest.FixtureRequest, state: Any,
                spelling: LayoutSpelling | None) -> None:
    """Skip a CPU scaling case under a layout beyond dp unless the layouts were named."""
    if (spelling is not None and state.settings.layouts is None
            and any(kind != "dp" for kind, _ in spelling.degrees)
            and _on_cpu_ladder(request, state)):
        _leave_out(request, LAYOUTS, f"its layouts beyond dp ({spelling.text}) are opt-in "
                   "(tests/ checks each layout against one process)")


def summary_line(config: pytest.Config) -> str | None:
    """The run's word on what the CPU's scaling ladder left out, and the flags that run it."""
    stashed = config.stash.get(LEFT_OUT, {})
    left = {what: stashed[what] for what in FLAGS if stashed.get(what)}
    if not left:
        return None
    parts = [f"{len(ids)} {'under ' if what == LAYOUTS else 'in '}{what} ({FLAGS[what]})"
             for what, ids in left.items()]
    total = sum(len(ids) for ids in left.values())
    return (f"pytest-dlperf: on this CPU the scaling ladder ran fp32 under dp; {total} of its "
            f"cases were left out, {', '.join(parts)}: the flag beside each runs them")
