"""A busy machine: whether a launch ran beside heavy interference, and what to say when a case
is left unjudged for it. Pure functions of the measured interference
(``core.interference.Interference``), tested on numbers alone (tests/test_busy.py).

In baseline mode the baseline never shared tonight's interference: a launch that others slowed
says nothing about the code, so it is retried, and a case whose launches stay beside it fails as
**machine busy**, an outcome of its own, never as a regression.
"""

from __future__ import annotations

from ..core.interference import Interference

MACHINE_BUSY = "machine-busy"  # the outcome's name, in the results file and for bisect
# Launches retried beside heavy interference before the case is left unjudged, and the pause
# before each: a burst (another job's compile step, a cron job) is over within seconds, and
# interference still there after two more launches and their pauses is a load, not a burst;
# more retries would only delay the answer by a launch each.
RETRIES = 2
PAUSE_S = 3.0


def is_busy(seen: Interference, threshold: float) -> bool:
    """Others (their CPU time and the steal) took more than ``threshold`` of the machine.
    Unmeasured (no /proc): never busy. A threshold of 1 turns the check off."""
    share = seen.share
    return share is not None and share > threshold


def _times(count: int) -> str:
    return {0: "not retried", 1: "retried once", 2: "retried twice"}.get(
        count, f"retried {count} times")


def describe(seen: Interference) -> str:
    """What was measured: "others used 48% of the 2 cores, steal 0%" (and the GPUs' others)."""
    if seen.others_cpu is None:
        text = "others' CPU time was not measured (no /proc/stat)"
    else:
        cores = f"{seen.cores} core{'s' if seen.cores != 1 else ''}"
        text = f"others used {seen.others_cpu:.0%} of the {cores}, steal {seen.steal or 0:.0%}"
    if seen.gpu_processes:
        listed = ", ".join(f"pid {p.pid} ({p.used_memory_mib:,.0f} MiB)"
                           for p in seen.gpu_processes[:3])
        more = len(seen.gpu_processes) - 3
        text += (f"; {len(seen.gpu_processes)} other process(es) on the GPUs: {listed}"
                 + (f" and {more} more" if more > 0 else ""))
    return text


def message(case: str, seen: Interference, label: str, retries: int, threshold: float,
            recording: bool) -> str:
    """Why ``case`` is not judged: the machine was busy through ``label`` and its retries."""
    then = ("nothing was recorded: a baseline measured beside it would judge every later run "
            "against a busy machine" if recording else
            "the baseline never shared this interference, so the case is not judged")
    return (f"pytest-dlperf: MACHINE BUSY, {case} not judged: {describe(seen)}, during "
            f"{label} (above --dlperf-busy-threshold {threshold:.0%}); {_times(retries)}; "
            f"{then}. Run it again on a quieter machine; or compare head against base "
            "side by side (--dlperf-ab), where both sides share the machine; or, beside a job "
            "you cannot stop, give the ranks fewer cores than it leaves (taskset -c 0 pytest "
            "...: a rank computes with as many threads as the cores pytest may use, and ranks "
            "whose threads wait on another job's run many times slower; fewer threads are a "
            "case of their own, with a baseline of their own)")


def summary_line(count: int) -> str:
    """The run's last word on what stayed unjudged."""
    return f"{count} case(s) not judged: the machine was busy"
