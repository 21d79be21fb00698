"""A scaling efficiency above 100%: what no layout reaches, and so a 1n1d reference that was slow.

Efficiency is speedup / devices, the speedup taken against the 1n1d median at the same
per-device batch, for every layout. None of them can beat linear: data parallelism (DDP or FSDP)
gives every device the 1n1d work plus the gradients' all-reduce (and FSDP's gathers); tensor and
pipeline parallelism split one replica's work over their ranks, at best that many times one
device's speed, less what the ranks exchange. A case a little above 100% is the two measurements'
noise (``MARGIN``: the default tolerance); far above, the reference is what is wrong. A run warns
beyond ``MARGIN``; a recording run refuses a baseline beyond ``BOUND`` (as an MFU above 100% is
refused): a baseline's efficiency taken against a disturbed reference would judge every later
run against a figure no run can reach (2787% recorded once; the next run failed "SCALING
REGRESSION ... below the threshold 2648.0%").
"""

from __future__ import annotations

from ..core.parallel import Layout
from .record import CaseReport

# Beyond what the plugin calls a difference at all (the default tolerance, 5%): a warning.
MARGIN = 1.05
# Far beyond it: not recorded. Two measurements minutes apart on a shared VM have read 40%
# apart (docs/measurements.md); half again above linear is past that.
BOUND = 1.5


def why_linear(layout: Layout, devices: int) -> str:
    """Why the case's layout cannot beat linear scaling, in its own terms."""
    split = [kind for kind in ("tp", "pp") if layout.uses(kind)]
    if split:
        names = {"tp": "tensor", "pp": "pipeline"}
        kinds = " and ".join(f"{names[kind]} parallelism" for kind in split)
        return (f"{kinds} split one replica's work over its ranks, at best that many times one "
                f"device's speed ({devices} devices: speedup {devices}, efficiency 100%), less "
                "what the ranks exchange")
    sharded = "FSDP" if layout.uses("fsdp") else "data parallelism"
    return (f"{sharded} at the same per-device batch gives each of the {devices} devices the "
            "1n1d work plus the gradients' exchange, which cannot reach 100%")


def _figures(report: CaseReport) -> str:
    unit = f"{report.workload.unit}/s"
    reference = f" ({report.reference:,.2f} {unit})" if report.reference is not None else ""
    return (f"scaling efficiency {report.efficiency or 0:.1%} (speedup {report.speedup or 0:.2f}"
            f" on {report.topology.world_size} devices) is above 100%, and "
            f"{why_linear(report.layout, report.topology.world_size)}: the 1n1d "
            f"reference{reference} was likely disturbed or slow (measured or recorded under "
            "another load: other jobs, CPU frequency scaling, another machine state)")


def warning(report: CaseReport) -> str | None:
    """Beyond ``MARGIN``: the speedup and efficiency are not to be trusted."""
    if report.efficiency is None or report.efficiency <= MARGIN:
        return None
    return (f"pytest-dlperf: {report.case}: {_figures(report)}, so the speedup and efficiency "
            "are not to be trusted; record the 1n1d case again on a quiet machine "
            "(--dlperf-update-baselines -k 1n1d), then this one")


def refuses(efficiency: float | None) -> bool:
    """Whether a recording run refuses a baseline of this efficiency."""
    return efficiency is not None and efficiency > BOUND


def refused_message(report: CaseReport) -> str:
    """The recording run's failure: nothing was written."""
    return (f"pytest-dlperf: {report.case}: baseline not recorded: {_figures(report)}. A "
            f"recording run refuses an efficiency above {BOUND:.0%} (its baseline would judge "
            "every later run against a figure no run reaches); record the 1n1d case again on a "
            "quiet machine (--dlperf-update-baselines -k 1n1d), then this one")
