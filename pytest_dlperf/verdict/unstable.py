"""Windows of one launch far apart: a case measured with that much noise is flagged, and a run
asked to record its baseline refuses it (``too_unstable_to_record``). Launches far apart are
not this: they are the machine's drift, which the verdict models (``levels``, ``drift``).
Pure functions of the figures and the policy, as ``decide``'s."""

from __future__ import annotations

import math

from .record import CaseReport
from .stats import NO_BASELINE, within_launch_df

RECORD_ALPHA = 0.05
"""How sure the windows must make us that their noise is above ``--dlperf-unstable-cv``
before a baseline is refused (one-sided)."""


def record_limit(unstable_cv: float, df: int) -> float:
    """The highest coefficient of variation within launches, from ``df`` degrees of freedom,
    that a noise of ``unstable_cv`` still gives by chance at least ``RECORD_ALPHA`` of the time:
    the upper chi-square bound of a standard deviation (``unstable_cv`` x 1.45 from 3 launches
    of 3 windows, x 1.27 from 3 of 7, x 1.0 from very many)."""
    from scipy.stats import chi2

    if df < 1:
        return math.inf
    return unstable_cv * math.sqrt(float(chi2.ppf(1 - RECORD_ALPHA, df)) / df)


def too_unstable_to_record(within_cv: float | None, unstable_cv: float, df: int) -> bool:
    """Whether a baseline this run would record is refused: the windows of its launches vary
    around their own launch's mean (``stats.within_launch_cv``, from ``df`` degrees of freedom,
    ``stats.within_launch_df``) by more than ``--dlperf-unstable-cv`` (``unstable_cv``), beyond
    the sampling error of so few windows (``record_limit``).

    Only the spread *within* launches says whether a launch measured anything: windows 122%
    apart inside one launch (another job on the cores) give a figure any later run can fall
    either side of. The spread *between* launches and runs is the machine's drift, which the
    verdict models (``levels``, ``drift``); refusing on it failed the first recording run of an
    MLP on an idle 2-core VM, whose launch 1 read 28.7k samples/s and launches 2-3 18.4-19.7k
    (windows within each launch a few percent apart). And only a noise the windows *show* to be
    above the limit: from 3 launches of 3 windows a standard deviation is uncertain by about a
    third, and the README's MLP on two ranks of a 2-core VM, ~7% within launches, read 10.4%
    once in CI and was refused (4.8-9.0% in four runs of the same hour). Refused rather than
    recorded with a mark, because a baseline is only read later, by runs that trust it, and a
    mark on the file is read by no one when the nightly goes red. The case fails, nothing is
    written (an existing baseline stays as it was), and the message says how to record it
    anyway: a quieter machine, longer windows, or a higher ``--dlperf-unstable-cv``. Launches
    of one window each have no spread within them: nothing to refuse on."""
    return within_cv is not None and within_cv > record_limit(unstable_cv, df)


def unrecorded_message(report: CaseReport, unstable_cv: float) -> str:
    """The failure of a case whose baseline ``too_unstable_to_record`` refused."""
    samples = report.result.samples_per_s
    within = report.within_cv or 0.0
    df = within_launch_df(report.result.launches)
    bound = record_limit(1.0, df)  # how far above a limit so few windows may read by chance
    forced = math.floor(within / bound * 100) + 1  # the least whole percentage that records it
    kept = (f"nothing was written to {report.baseline_path}"
            if report.verdict.outcome == NO_BASELINE
            else f"the stored baseline {report.baseline_path} is left as it was")
    return (f"pytest-dlperf: {report.case}: baseline not recorded: the windows of its "
            f"{len(report.result.launches)} launch(es) vary around their own launch's mean by "
            f"{within:.1%} (coefficient of variation within launches, {df} degrees of "
            f"freedom), above --dlperf-unstable-cv {unstable_cv:.0%} beyond their sampling "
            f"error (so few windows read up to {unstable_cv * bound:.1%} from a noise of "
            f"{unstable_cv:.0%}; all {len(samples)} windows: "
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
