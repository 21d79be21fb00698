"""On a CPU the scaling ladder runs fp32 under dp (issue 74: the design card's first command,
`pytest perf_tests -m multinode --nodes 4 -k torch --dlperf-protocol quick`, selected 36 cases,
18 of them AMP and 18 under layouts beyond dp, and did not finish in 700 s on two cores): its AMP
cases and layouts beyond dp skip naming the flag that runs them, the run counts them, and the
flags run them. In-process pytester runs whose tests take the fixtures and train nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

LADDER = '''
import pytest

@pytest.mark.multinode
@pytest.mark.layouts("dp", "fsdp")
def test_scaling(cluster, layout, amp):
    pass

@pytest.mark.layouts("dp", "fsdp")
def test_single_node(cluster, layout, amp):
    pass
'''


def test_the_cpu_ladders_amp_and_layouts_beyond_dp_are_opt_in(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object]) -> None:
    fake_hardware(cpu_count=2, cpu_bf16=True)
    pytester.makepyfile(test_ladder=LADDER)
    run = pytester.runpytest("-m", "multinode", "--nodes", "2", "-rs")
    # 1n1d and 2n1d, each dp and fsdp, each fp32 and AMP: only dp in fp32 runs
    run.assert_outcomes(passed=2, skipped=6)
    for says in ("*on a CPU the scaling ladder runs fp32 under data parallelism; its layouts "
                 "beyond dp (fsdp) are opt-in*: --dlperf-layouts dp,fsdp,tp,pp runs it",
                 "*on a CPU the scaling ladder runs fp32 under data parallelism; its AMP cases "
                 "are opt-in*: --dlperf-precisions fp32,amp runs it",
                 "pytest-dlperf: on this CPU the scaling ladder ran fp32 under dp; 6 of its "
                 "cases were left out, 2 in AMP (--dlperf-precisions fp32,amp), 4 under "
                 "layouts beyond dp (--dlperf-layouts dp,fsdp,tp,pp): the flag beside each "
                 "runs them"):
        run.stdout.fnmatch_lines([says])
    # named, they run; and the single-node cases were never the ladder's
    named = pytester.runpytest("-m", "multinode", "--nodes", "2", "--dlperf-layouts", "dp,fsdp",
                               "--dlperf-precisions", "fp32,amp")
    named.assert_outcomes(passed=8)
    assert "left out" not in named.stdout.str()
    single = pytester.runpytest("-k", "single_node", "--devices-per-node", "2")
    single.assert_outcomes(passed=8)  # 1n1d and 1n2d, dp and fsdp, fp32 and AMP
