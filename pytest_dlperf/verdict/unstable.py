"""Windows of one launch far apart: a case measured with that much noise is flagged, and a run
asked to record its baseline refuses it (``too_unstable_to_record``). Launches far apart are
not this: they are the machine's drift, which the verdict models (``levels``, ``drift``).
Pure functions of the figures and the policy, as ``decide``'s."""

from __future__ import annotations

import math

from .record import CaseReport
from .stats import NO_BASELINE


def too_unstable_to_record(within_cv: float | None, unstable_cv: float) -> bool:
    """Whether a baseline this run would record is refused: the windows of its launches vary
    around their own launch's mean (``stats.within_launch_cv``) by more than
    ``--dlperf-unstable-cv`` (``unstable_cv``).

    Only the spread *within* launches says whether a launch measured anything: windows 122%
    apart inside one launch (another job on the cores) give a figure any later run can fall
    either side of. The spread *between* launches and runs is the machine's drift, which the
    verdict models (``levels``, ``drift``); refusing on it failed the first recording run of an
    MLP on an idle 2-core VM, whose launch 1 read 28.7k samples/s and launches 2-3 18.4-19.7k
    (windows within each launch a few percent apart). Refused rather than recorded with a
    mark, because a baseline is only read later, by runs that trust it, and a mark on the file
    is read by no one when the nightly goes red. The case fails, nothing is written (an
    existing baseline stays as it was), and the message says how to record it anyway: a
    quieter machine, longer windows, or a higher ``--dlperf-unstable-cv``. Launches of one
    window each have no spread within them: nothing to refuse on."""
    return within_cv is not None and within_cv > unstable_cv


def unrecorded_message(report: CaseReport, unstable_cv: float) -> str:
    """The failure of a case whose baseline ``too_unstable_to_record`` refused."""
    samples = report.result.samples_per_s
    within = report.within_cv or 0.0
    forced = math.floor(within * 100) + 1  # the least whole percentage that records it
    kept = (f"nothing was written to {report.baseline_path}"
            if report.verdict.outcome == NO_BASELINE
            else f"the stored baseline {report.baseline_path} is left as it was")
    return (f"pytest-dlperf: {report.case}: baseline not recorded: the windows of its "
            f"{len(report.result.launches)} launch(es) vary around their own launch's mean by "
            f"{within:.1%} (coefficient of variation within launches), above "
            f"--dlperf-unstable-cv {unstable_cv:.0%} (all {len(samples)} windows: "
            f"{min(samples):,.2f} to {max(samples):,.2f} {report.workload.unit}/s); a launch "
            f"that noisy measured nothing a baseline could judge by ({kept}). Quiet the machine "
            "(other jobs, CPU frequency scaling) or lengthen the windows (--dlperf-steps) and "
            "record again; to record it as it is on a host known to be this noisy, allow it "
            f"with --dlperf-unstable-cv {forced}%")


def unstable_warning(report: CaseReport, unstable_cv: float) -> str | None:
    """Windows of one launch far apart: the launches measured with that much noise (launches
    apart from each other are the drift the verdict models, and its evidence says how much)."""
    within = report.within_cv
    if within is None or within <= unstable_cv:
        return None
    samples = report.result.samples_per_s
    unit = report.workload.unit
    return (f"pytest-dlperf: {report.case} is unstable: the windows of its launches vary "
            f"around their own launch's mean by {within:.1%} (coefficient of variation within "
            f"launches; --dlperf-unstable-cv {unstable_cv:.0%}), all {len(samples)} "
            f"from {min(samples):,.2f} to {max(samples):,.2f} {unit}/s; its verdict is weaker "
            "for it. Quiet the machine (other jobs, CPU frequency scaling), or lengthen the "
            "windows with --dlperf-steps")
