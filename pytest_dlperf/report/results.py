"""The results file (``--dlperf-json``): pytest-benchmark's JSON format, one entry per case with
pytest-dlperf's figures in ``extra_info``, and the lines that say what a run did to the
baselines."""

from __future__ import annotations

import datetime
from typing import Any

from ..store.baselines import EFFICIENCY
from ..verdict.record import CaseReport
from .tables import frameworks_side_by_side


def benchmark_entry(report: CaseReport) -> dict[str, Any]:
    """One entry of pytest-benchmark's ``benchmarks[]``: stats are seconds per training step
    over the timed windows (one round per window, ``iterations`` = steps per window)."""
    from pytest_benchmark.stats import Stats

    stats = Stats()
    for elapsed in report.result.window_s:
        stats.update(elapsed / report.result.steps)
    stats_json = {**stats.as_dict(), "data": list(stats.data), "iterations": report.result.steps}
    search = report.batch_search
    searches: dict[str, dict[str, Any] | None] = {"batch_search": None, "size_search": None}
    if search is not None:
        searches[search.record_key] = search.to_json()
    batched = searches["batch_search"] is not None
    return {
        "group": f"dlperf:{report.workload.model}",
        "name": report.name,
        "fullname": report.nodeid,
        "params": report.params,
        "param": report.param,
        "options": {"protocol": report.protocol.name, "warmup_steps": report.protocol.warmup_steps,
                    "steps": report.protocol.steps, "repeats": report.protocol.repeats,
                    "timer": "time.perf_counter"},
        "stats": stats_json,
        "extra_info": {
            "case": report.case,
            "framework": report.framework,
            "framework_version": report.framework_version,
            "model": report.workload.model,
            "topology": report.topology.to_json(),
            "launcher": report.launcher,
            "machine": report.machine,
            "rendezvous_isolation": report.isolation,
            "network": dict(report.network) or None,
            "ab": dict(report.ab) or None,
            "precision": report.precision.label,
            "batch_size": report.workload.batch_size,
            "batch_size_requested": ("max" if batched else report.workload.batch_size),
            # --dlperf-size NAME=max: size_search, how it was found (its value: sizes)
            **searches,
            "global_batch": report.result.global_batch,
            # How the ranks shared the work: "dp" (plain data parallelism) or its id, the
            # degrees, and the units one sample holds (a language model's tokens): the
            # samples_per_s figures below count units.
            "layout": report.layout.id or "dp",
            "layout_degrees": report.layout.to_json(),
            "data_parallel_ranks": (report.layout.data_parallel
                                    if not report.layout.is_data_parallel
                                    else report.topology.world_size),
            "units_per_sample": report.workload.units_per_sample,
            "unit": report.workload.unit,
            "sizes": dict(report.workload.sizes),
            "samples_per_s": report.result.median,
            # One iteration at the median (a step's global batch over the median rate).
            "latency_ms": 1e3 * report.result.step_s,
            "sweep": dict(report.sweep) or None,
            "samples_per_s_repeats": report.result.samples_per_s,
            "samples_per_s_min": report.result.min,
            "samples_per_s_max": report.result.max,
            "samples_per_s_cv": report.cv,
            "samples_per_s_within_launch_cv": report.within_cv,
            "repeats_measured": len(report.result.window_s),
            "launches": len(report.result.windows_per_launch),
            "samples_per_s_launches": report.result.launches,
            "warmup_s": report.result.warmup_s,
            "first_step_s": report.result.first_step_s,
            "compiler": report.compiler,
            "wall_s": report.result.wall_s,
            "launched_at": report.launched_at,
            "first_timed_step_at": report.result.timed_from,
            # What each launch ran beside: other processes' CPU, steal, the GPUs' others.
            "interference": [seen.to_json() for seen in report.result.interference],
            "peak_memory_bytes": report.result.peak_memory,
            "peak_memory_launches": report.result.memory_launches,
            "peak_memory_per_rank": [r.to_json() for r in report.result.ranks],
            # Each window's minor page faults per step, the most over the ranks, by launch:
            # the heap's state (docs/resources.md "The heap allocator").
            "page_faults_per_step_launches": report.result.faults_launches,
            "memory_verdict": (report.memory_verdict.to_json()
                               if report.memory_verdict else None),
            "flops_per_sample": report.flops.per_sample if report.flops else None,
            "flops_source": report.flops.source if report.flops else None,
            "flops_problem": report.flops.problem if report.flops else None,
            "achieved_flops_per_s": report.achieved_flops_per_s,
            "mfu": report.mfu,
            "mfu_missing": report.mfu_missing,
            "mfu_peak": report.peak.to_json() if report.peak else None,
            "speedup": report.speedup,
            "scaling_efficiency": report.efficiency,
            # Each window's, by launch, as the baseline keeps them (None: one device): what
            # a night's run adds to a baseline with (store.nights).
            "scaling_efficiency_launches": _launches(report, EFFICIENCY),
            # Where a step's time went: the diagnostic steps after the windows (seconds per
            # step of each phase; docs/phases.md), and the scaling model held against the
            # efficiency (multi-device cases).
            "phases": report.phases.to_json() if report.phases else None,
            "scaling_model": (report.scaling_model.to_json() if report.scaling_model
                              else None),
            "efficiency_verdict": (report.efficiency_verdict.to_json()
                                   if report.efficiency_verdict else None),
            "verdict": {**report.verdict.to_json(), "text": report.verdict_text},
            "baseline_update": report.baseline_update(),
            "baseline_path": report.baseline_path,
            "history": None if report.history_runs is None else {
                "runs": report.history_runs,
                "steps": [step.to_json() for step in report.history_steps],
                "blocking": (report.history_steps.index(report.history_blocking)
                             if report.history_blocking is not None else None)},
            "fingerprint": report.fingerprint,
            "environment": report.environment,
        },
    }


def _launches(report: CaseReport, metric: str) -> list[list[float]] | None:
    found = report.metrics.get(metric)
    return found.launches if found is not None else None


def change_lines(reports: list[CaseReport]) -> list[str]:
    """What --dlperf-update-baselines did, per case: old median -> new median."""
    lines = []
    for report in reports:
        update = report.baseline_update()
        if update is None:
            continue
        unit = f"{report.workload.unit}/s"
        new, old = update["new_median"], update["old_median"]
        if update["action"] == "kept":
            text = f"kept (exists; --dlperf-update-baselines=missing), measured {new:,.2f}"
        elif update["action"] == "added":
            text = (f"added this run's launches: {old:,.2f} -> {new:,.2f} {unit} over "
                    f"{update['launches']} launches of {update['runs']} run(s)")
        elif old is None:
            text = f"{update['action']}: {new:,.2f} {unit}"
            if update["backup"]:
                text += f" (the unreadable old file is kept as {update['backup']})"
        else:
            text = f"updated: {old:,.2f} -> {new:,.2f} {unit} ({new / old - 1:+.1%})"
            if update["migrated_from"]:
                text += f" (schema 1 file {update['migrated_from']} replaced)"
        lines.append(f"{report.case}: {text}  [{update['path']}]")
    return lines


def results_json(reports: list[CaseReport], commit: dict[str, Any],
                 machine_info: dict[str, Any],
                 not_judged: list[dict[str, Any]] | None = None,
                 sweeps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The whole results file, with the session's commit (``pytest_dlperf_commit_info``) and
    pytest-benchmark's machine info (the pytest side asks its hook, which a conftest may
    implement). ``not_judged``: the cases that failed without figures to judge (outcome
    ``machine-busy``: the machine was busy), each with what was measured. ``sweeps``: each
    sweep's rungs together (plugin.sweep)."""
    from pytest_benchmark import __version__

    benchmarks = [benchmark_entry(r) for r in reports]
    return {
        "machine_info": machine_info,
        "commit_info": commit,
        "benchmarks": benchmarks,
        # pytest-benchmark ignores keys it does not know; None with a single framework.
        "dlperf_frameworks_side_by_side": frameworks_side_by_side(benchmarks),
        "dlperf_not_judged": list(not_judged or []),
        "dlperf_sweeps": list(sweeps or []),
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "version": __version__,
    }


