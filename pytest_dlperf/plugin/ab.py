"""A/B mode (``--dlperf-ab REV``, ``--dlperf-ab-python PATH``; the base side: ``absetup``):
every selected case is launched
alternately on a base side and on the head (this checkout, as it is), or with
``--dlperf-ab-mode duet`` on both at once on halves of the host (``duet``), and judged from the
pairs (``verdict.paired``), with more of them for a slowdown every pair shows but nothing yet
proves (``paired.more_pairs``). No baseline is read or written, and nothing goes to the
history. Each side's phases (``core.phases``, over all its launches) are kept in the record's
``ab`` beside its median: the A/B table's per-phase ratios.

The base side differs from the head in what was asked: with ``--dlperf-ab``, its recipes and the
user's model code come from a worktree of REV (the recipe's import root, mapped from this
checkout into the worktree, goes first on the ranks' ``sys.path``); with
``--dlperf-ab-python``, its ranks run under that interpreter. The case's settings (its batch,
sizes, protocol) are the head's test's, and the plugin's own code is this one on both sides.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

from ..core.facts import Facts
from ..core.protocol import Result
from ..core.spec import RankSpec
from ..core.workload import CaseWorkload
from ..launch import Cluster
from ..verdict import paired
from ..verdict.record import CaseReport, efficiencies
from ..verdict.stats import Verdict, coefficient_of_variation, look_alpha
from . import duet
from .case import Case, Prepared
from .launches import Launches
from .outcome import DLPerfWarning, conclude

# Each side's cluster and the spec its ranks get.
Sides = duet.Sides


def measure(prepared: Prepared) -> CaseReport:
    """One case in A/B mode: pairs of launches until the verdict is settled or the pairs
    run out; the head's test fails on a regression."""
    case = prepared.case
    state, cluster = case.state, case.cluster
    setup = state.ab
    assert setup is not None
    version = case.framework_version()
    case.check_modes()
    launches = Launches(case)
    sized = prepared.sized
    sides, codes = _sides(prepared)
    policy = case.policy(None)
    per_round = policy.launches
    most = max(per_round, -(-policy.max_repeats // policy.windows_per_launch))
    alpha = look_alpha(paired.looks(per_round, most))
    halves = None
    if setup.mode in ("duet", "auto"):
        halves = duet.host_halves(cluster.device_type, len(state.hardware.gpus))
        if setup.mode == "duet":
            duet.check(case.id, cluster, halves)
        elif duet.refusal(cluster, halves) is not None:  # auto: turns where it does not fit
            halves = None
    fitted = None if halves is not None else fitting_threads(cluster,
                                                             state.settings.busy_threshold)
    if fitted is not None:  # turns: threads that fit what another job leaves of the machine
        sides = {side: (c, _with_threads(spec, fitted[0])) for side, (c, spec) in sides.items()}
    pairs: list[tuple[Result, Result]] = []
    envs: dict[str, dict[str, Any]] = {}  # what each side's ranks saw (its framework build)
    launched_at = time.time()

    def add(count: int) -> Verdict:
        for _ in range(count):
            pairs.append(_pair(launches, sides, halves, len(pairs), policy.windows_per_launch,
                               envs))
            for side, code in codes.items():  # each side's ranks ran that side's code
                setup.check_imports(side, code, envs[side])
        return paired.paired_compare([(b.samples_per_s, h.samples_per_s) for b, h in pairs],
                                     policy.tolerance, alpha=alpha, per_window=halves is not None)

    while True:
        verdict = add(per_round)
        if not paired.wants_more_pairs(verdict) or len(pairs) + per_round > most:
            break
    if most < paired.PAIR_LIMIT:  # a slowdown every pair shows but nothing yet proves
        extra = paired.more_pairs(verdict, [(b.samples_per_s, h.samples_per_s)
                                            for b, h in pairs], per_window=halves is not None)
        if extra:
            verdict = add(extra)
    report = _report(case, version, sized, pairs, verdict, policy.tolerance, envs, launched_at,
                     launches, sides, halves)
    report = replace(report, ab=Facts({**report.ab, "code": setup.code_facts(
        codes, {side: spec for side, (_, spec) in sides.items()})}))
    if fitted is not None:
        report = _fitted(report, fitted, case, cluster)
    state.reports.append(report)
    conclude(case.node, paired.decide(report, policy), cluster.launcher,
             state.settings.timeout)
    return report


def _sides(prepared: Prepared) -> tuple[Sides, dict[str, Any]]:
    """Each side's cluster and spec (its code's import paths in it), and where its code comes
    from (``absetup.AbSetup.side_spec``)."""
    case = prepared.case
    setup = case.state.ab
    assert setup is not None
    head_spec = case.spec(prepared.workload, prepared.sized, prepared.recipe)
    clusters = setup.clusters(case.cluster, case.framework)
    sides: Sides = {}
    codes: dict[str, Any] = {}
    for side, cluster in clusters.items():
        spec, codes[side] = setup.side_spec(case.node, head_spec, side, cluster)
        sides[side] = (cluster, spec)
    return sides, codes


# How long the machine is watched before a turns A/B run, for the load another job puts on it.
LOOK_S = 1.0


def fitting_threads(cluster: Cluster, threshold: float) -> tuple[int, float] | None:
    """Threads a rank for turn-taking launches on a CPU host that another job keeps busy: the
    cores the others leave (at least one) over the ranks, where others used more than
    ``threshold`` of the machine during a short look and fewer threads than the case's would
    fit; None where the host is quiet enough (or not a CPU case, or nothing to measure)."""
    if cluster.device_type != "cpu" or threshold >= 1:
        return None
    from ..core import interference

    watch = interference.Watch()
    time.sleep(LOOK_S)
    seen = watch.stop()
    if seen.share is None or seen.share <= threshold:
        return None
    cores = len(os.sched_getaffinity(0))
    ranks = cluster.topology.devices_per_node
    fit = max(1, int(cores * (1 - seen.share)) // ranks)
    if fit >= cluster.topology.threads_per_worker:
        return None
    return fit, seen.share


def _fitted(report: CaseReport, fitted: tuple[int, float], case: Case,
            cluster: Cluster) -> CaseReport:
    """The record of a turns run at fitted threads (``fitting_threads``), and its warning."""
    asked = cluster.topology.threads_per_worker
    case.node.warn(DLPerfWarning(
        f"pytest-dlperf: {case.id}: other processes used {fitted[1]:.0%} of this host's "
        f"{len(os.sched_getaffinity(0))} cores when the A/B run began (above "
        f"--dlperf-busy-threshold), so both sides ran {fitted[0]} thread(s) a rank instead of "
        f"{asked}: ranks whose threads outnumber the cores left to them wait on each other's "
        "descheduled threads, and read the same ~10x slower whatever the code; head and base "
        "are compared at the same threads, the figures are not the case's own (or use "
        "--dlperf-ab-mode duet)"))
    return replace(report, ab=Facts({**report.ab, "threads": {
        "per_rank": fitted[0], "others_share": fitted[1], "asked": asked}}))


def _with_threads(spec: RankSpec, threads: int) -> RankSpec:
    """``spec`` with its own threads a rank (the cores it may use kept: all of them)."""
    return replace(spec, threads=threads, cpus=sorted(os.sched_getaffinity(0)))


def _pair(launches: Launches, sides: Sides, halves: duet.Halves | None, index: int,
          windows: int, envs: dict[str, dict[str, Any]]) -> tuple[Result, Result]:
    """Pair ``index``: (base, head) figures, in turns (ABBA) or in duet (at once)."""
    setup = launches.case.state.ab
    assert setup is not None

    def who(side: str) -> str:
        return f" (A/B {side} side: {setup.base if side == 'base' else setup.head})"

    if halves is not None:
        (base, envs["base"]), (head, envs["head"]) = duet.launch(launches, sides, halves, index,
                                                                 windows, who)
        return base, head
    figures: dict[str, Result] = {}
    for side in paired.order(index):
        cluster, spec = sides[side]
        spec = replace(spec, protocol=replace(spec.protocol, repeats=windows))
        figures[side], envs[side] = launches.run(cluster, spec, label=f"{side}, pair "
                                                 f"{index + 1}", who=who(side))
    return figures["base"], figures["head"]


def _joined(results: list[Result]) -> Result:
    joined = results[0]
    for more in results[1:]:
        joined = joined.extended(more)
    return joined


def _report(case: Case, version: str, sized: CaseWorkload, pairs: list[tuple[Result, Result]],
            verdict: Verdict, tolerance: float, envs: dict[str, dict[str, Any]],
            launched_at: float, launches: Launches, sides: Sides,
            halves: duet.Halves | None) -> CaseReport:
    """The case record: the head's figures, the paired verdict, each side's in ``ab``."""
    setup = case.state.ab
    env = envs["head"]
    assert setup is not None
    head, base = _joined([h for _, h in pairs]), _joined([b for b, _ in pairs])
    devices = case.cluster.world_size
    efficiency_verdict = None
    references: dict[str, float | None] = {"head": None, "base": None}
    if devices > 1:
        references = _references(case, launches, sides)
        if references["head"] and references["base"]:
            efficiency_verdict = paired.paired_compare(
                [(efficiencies(b.samples_per_s, references["base"], devices),
                  efficiencies(h.samples_per_s, references["head"], devices)) for b, h in pairs],
                tolerance, alpha=verdict.alpha, per_window=halves is not None)
    ratio = paired.ratio(verdict)
    facts = {
        "base": setup.base, "head": setup.head, "base_revision": setup.revision,
        "base_commit": setup.commit.sha if setup.commit else None,
        "base_python": setup.base_python(case.cluster, case.framework), "mode": "turns" if halves is None else "duet",
        "mode_asked": setup.mode,
        "order": "ABBA" if halves is None else "at once, halves swapped ABAB",
        "halves": halves.to_json() if halves is not None else None,
        "base_framework_version": envs["base"].get("framework_version"),
        "head_framework_version": env.get("framework_version"),
        "pairs": [_pair_facts(i, b, h, halves) for i, (b, h) in enumerate(pairs)],
        "base_median": base.median, "head_median": head.median, "ratio": ratio,
        "ratio_ci": list(verdict.ratio_ci) if verdict.ratio_ci else None,
        "p_worse": verdict.p_worse, "p_better": verdict.p_better, "outcome": verdict.outcome,
        "efficiency": ({side: base_or_head.median / ref / devices for side, base_or_head, ref in
                        (("base", base, references["base"]), ("head", head, references["head"]))
                        if ref} if devices > 1 else None),
        "phases": _phases_facts(base, head),
    }
    if halves is not None and case.cluster.device_type == "cpu":
        # each side's ranks on half the cores: fewer threads than the case's own run (the
        # baselines' table), said under the A/B table so the two figures are not compared
        facts["threads"] = {"per_rank": max(1, len(halves.cpus[0]) // devices),
                            "asked": case.cluster.topology.threads_per_worker,
                            "cores_a_side": len(halves.cpus[0])}
    speedup = head.median / references["head"] if references["head"] else None
    fp = case.fingerprint(case.cluster.topology, version, env, sized, None)
    return CaseReport(
        **case.identity(version, env, sized, fp), result=head,
        verdict=verdict, efficiency_verdict=efficiency_verdict, launched_at=launched_at,
        cv=coefficient_of_variation(head.samples_per_s),
        reference=references["head"], speedup=speedup,
        efficiency=speedup / devices if speedup is not None else None, ab=Facts(facts))


def _phases_facts(base: Result, head: Result) -> dict[str, Any] | None:
    """Each side's phases over all its launches (``Phases.to_json``; None for a side that ran
    no diagnostic steps); None where neither did."""
    sides = {side: result.phases.figures().to_json() if result.phases is not None else None
             for side, result in (("base", base), ("head", head))}
    return sides if any(sides.values()) else None


def _pair_facts(index: int, base: Result, head: Result,
                halves: duet.Halves | None) -> dict[str, Any]:
    facts: dict[str, Any] = {"base": base.median, "head": head.median}
    if halves is None:
        return {"first": paired.order(index)[0], **facts}
    log_ratio = paired.log_ratios([(base.samples_per_s, head.samples_per_s)], per_window=True)
    return {"base_half": duet.HALVES[duet.base_half(index)], **facts,
            "window_log_ratio": log_ratio[0]}


def _references(case: Case, launches: Launches, sides: Sides) -> dict[str, float | None]:
    """Each side's 1n1d median with the same per-device batch: from this session's 1n1d case
    (its head figure, and its base figure in ``ab``), else measured now on that side."""
    from ..core.topology import make_topology

    state = case.state
    topology = make_topology(state.hardware, 1, 1, case.cluster.device_type)
    found = state.case_at(case.node, topology)
    for report in state.reports:
        if report.nodeid == found and report.ab:
            return {"head": report.result.median, "base": report.ab.get("base_median")}
    if not case.cluster.launcher.can_run(topology):
        return {"head": None, "base": None}
    return {side: launches.reference(spec, topology, cluster=cluster)
            for side, (cluster, spec) in sides.items()}
