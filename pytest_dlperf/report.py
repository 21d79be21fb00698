"""Reporting: the per-case record, the results file in pytest-benchmark's JSON format, and the
summary table (terminal or Markdown) rendered from that same JSON.

``python -m pytest_dlperf.report results.json`` prints the table as Markdown, for a CI job summary;
``python -m pytest_dlperf.report html STORE -o DIR`` writes the history's page (``htmlreport``).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .baselines import Change
from .batchsearch import Search
from .changepoints import Step
from .flops import FlopsCount, Peak
from .protocol import Protocol, Result
from .stats import Verdict
from .topology import Topology
from .workload import CaseWorkload, Precision


@dataclass
class CaseReport:
    case: str  # the nodeid: "perf_tests/test_resnet50_torch.py::test_resnet50_v15[1n2d-fp32]"
    name: str
    nodeid: str
    params: dict[str, Any]  # argname -> value as JSON (a topology by its id)
    framework: str
    framework_version: str
    topology: Topology
    precision: Precision
    workload: CaseWorkload
    protocol: Protocol
    result: Result
    verdict: Verdict
    baseline_path: str | None = None
    baseline_change: Change | None = None  # set when this run wrote (or kept) its baseline
    fingerprint: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    launched_at: float = 0.0  # epoch seconds when the case's processes were started
    launcher: str = "local"
    isolation: str | None = None  # local mode: "network-namespace" or "none"
    # Multi-device cases: median / the 1n1d median with the same per-device batch, and / devices.
    speedup: float | None = None
    efficiency: float | None = None
    efficiency_verdict: Verdict | None = None
    memory_verdict: Verdict | None = None  # peak memory (lower is better); None: not measured
    batch_search: Search | None = None  # --dlperf-batch-size max: how the batch was found
    flops: FlopsCount | None = None  # FLOPs per sample and where they came from
    achieved_flops_per_s: float | None = None  # per device
    peak: Peak | None = None  # the device's dense peak the MFU is taken against
    mfu: float | None = None
    reference: float | None = None  # the 1n1d median the speedup is taken against
    cv: float = 0.0  # coefficient of variation of the repeats
    compiler: str = "eager"
    param: str = ""  # pytest's parameter id (callspec.id)
    machine: str = ""  # --dlperf-machine: whose baselines judge this case
    other_machines: list[str] = field(default_factory=list)  # with a baseline of this case
    unnamed_baselines: str | None = None  # this case's baselines from before machines were named
    # --dlperf-history: runs of this case and fingerprint in it (this one included), the steps
    # of each metric over them, and the one tonight sits after unaccepted (it fails the case).
    history_runs: int | None = None
    history_steps: list[Step] = field(default_factory=list)
    history_blocking: Step | None = None

    @property
    def baseline_action(self) -> str | None:
        return self.baseline_change.action if self.baseline_change else None

    @property
    def verdict_text(self) -> str:
        if self.baseline_action:
            return self.baseline_action
        text = self.verdict.outcome
        for name, other in (("efficiency", self.efficiency_verdict),
                            ("memory", self.memory_verdict)):
            if other is not None and other.outcome in ("regression", "inconclusive"):
                what = f"{name} {other.outcome}"
                text = what if text == "pass" else f"{text}, {what}"
        step = self.history_blocking
        if step is not None:
            what = f"{step.name} step {step.point.change:+.1%}"
            text = what if text == "pass" else f"{text}, {what}"
        return text

    def benchmark_entry(self) -> dict[str, Any]:
        """One entry of pytest-benchmark's ``benchmarks[]``: stats are seconds per training step
        over the timed windows (one round per window, ``iterations`` = steps per window)."""
        from pytest_benchmark.stats import Stats

        stats = Stats()
        for elapsed in self.result.window_s:
            stats.update(elapsed / self.result.steps)
        stats_json = {**stats.as_dict(), "data": list(stats.data), "iterations": self.result.steps}
        return {
            "group": f"dlperf:{self.workload.model}",
            "name": self.name,
            "fullname": self.nodeid,
            "params": self.params,
            "param": self.param,
            "options": {"protocol": self.protocol.name, "warmup_steps": self.protocol.warmup_steps,
                        "steps": self.protocol.steps, "repeats": self.protocol.repeats,
                        "timer": "time.perf_counter"},
            "stats": stats_json,
            "extra_info": {
                "case": self.case,
                "framework": self.framework,
                "framework_version": self.framework_version,
                "model": self.workload.model,
                "topology": self.topology.to_json(),
                "launcher": self.launcher,
                "machine": self.machine,
                "rendezvous_isolation": self.isolation,
                "precision": self.precision.label,
                "batch_size": self.workload.batch_size,
                "batch_size_requested": "max" if self.batch_search else self.workload.batch_size,
                "batch_search": self.batch_search.to_json() if self.batch_search else None,
                "global_batch": self.result.global_batch,
                "unit": self.workload.unit,
                "sizes": dict(self.workload.sizes),
                "samples_per_s": self.result.median,
                "samples_per_s_repeats": self.result.samples_per_s,
                "samples_per_s_min": self.result.min,
                "samples_per_s_max": self.result.max,
                "samples_per_s_cv": self.cv,
                "repeats_measured": len(self.result.window_s),
                "launches": len(self.result.windows_per_launch),
                "samples_per_s_launches": self.result.launches,
                "warmup_s": self.result.warmup_s,
                "first_step_s": self.result.first_step_s,
                "compiler": self.compiler,
                "wall_s": self.result.wall_s,
                "launched_at": self.launched_at,
                "first_timed_step_at": self.result.timed_from,
                "peak_memory_bytes": self.result.peak_memory,
                "peak_memory_launches": self.result.memory_launches,
                "peak_memory_per_rank": [r.to_json() for r in self.result.ranks],
                "memory_verdict": (self.memory_verdict.to_json()
                                   if self.memory_verdict else None),
                "flops_per_sample": self.flops.per_sample if self.flops else None,
                "flops_source": self.flops.source if self.flops else None,
                "flops_problem": self.flops.problem if self.flops else None,
                "achieved_flops_per_s": self.achieved_flops_per_s,
                "mfu": self.mfu,
                "mfu_peak": self.peak.to_json() if self.peak else None,
                "speedup": self.speedup,
                "scaling_efficiency": self.efficiency,
                "efficiency_verdict": (self.efficiency_verdict.to_json()
                                       if self.efficiency_verdict else None),
                "verdict": {**self.verdict.to_json(), "text": self.verdict_text},
                "baseline_update": self.baseline_update(),
                "baseline_path": self.baseline_path,
                "history": None if self.history_runs is None else {
                    "runs": self.history_runs,
                    "steps": [step.to_json() for step in self.history_steps],
                    "blocking": (self.history_steps.index(self.history_blocking)
                                 if self.history_blocking is not None else None)},
                "fingerprint": self.fingerprint,
                "environment": self.environment,
            },
        }


    def baseline_update(self) -> dict[str, Any] | None:
        change = self.baseline_change
        if change is None:
            return None
        old = change.old.throughput.median if change.old else None
        return {"action": change.action, "path": self.baseline_path,
                "old_median": old, "new_median": change.new.throughput.median,
                "backup": str(change.backup) if change.backup else None,
                "launches": change.new.launch_count, "runs": len(change.new.runs),
                "migrated_from": str(change.migrated_from) if change.migrated_from else None}


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


def results_json(reports: list[CaseReport]) -> dict[str, Any]:
    """The whole results file, with pytest-benchmark's own machine and commit helpers."""
    from pytest_benchmark import __version__
    from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info
    from pytest_benchmark.utils import get_commit_info

    benchmarks = [r.benchmark_entry() for r in reports]
    return {
        "machine_info": pytest_benchmark_generate_machine_info(),
        "commit_info": get_commit_info(),
        "benchmarks": benchmarks,
        # pytest-benchmark ignores keys it does not know; None with a single framework.
        "dlperf_frameworks_side_by_side": frameworks_side_by_side(benchmarks),
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "version": __version__,
    }


HEADER = ["case", "nodes x dev", "precision", "batch/dev", "throughput (median)", "min-max",
          "cv", "n", "speedup (eff.)", "peak mem", "FLOP/s/dev (MFU)", "baseline", "delta",
          "verdict"]


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _count(info: dict[str, Any]) -> str:
    """Windows measured, and over how many launches when more than one."""
    windows = info.get("repeats_measured", len(info["samples_per_s_repeats"]))
    launches = info.get("launches", 1)
    return str(windows) if launches == 1 else f"{windows}/{launches}L"


def _speedup(speedup: float | None, efficiency: float | None) -> str:
    if speedup is None or efficiency is None:
        return "-"
    return f"{speedup:.2f} ({efficiency:.0%})"


def _memory(value: float | None) -> str:
    """Peak memory, binary units: GiB from 1 GiB up, else MiB."""
    if value is None:
        return "-"
    return f"{value / 2 ** 30:.2f} GiB" if value >= 2 ** 30 else f"{value / 2 ** 20:,.0f} MiB"


def _batch(info: dict[str, Any]) -> str:
    """The per-device batch; a searched one as ``max=N``."""
    if info.get("batch_size_requested") == "max":
        return f"max={info['batch_size']}"
    return str(info["batch_size"])


def _utilization(achieved: float | None, mfu: float | None) -> str:
    if achieved is None:
        return "-"
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if achieved >= size:
            text = f"{achieved / size:,.1f}{unit}"
            break
    else:
        text = f"{achieved:,.0f}"
    return text if mfu is None else f"{text} ({mfu:.1%})"


def rows(benchmarks: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for bench in benchmarks:
        info = bench["extra_info"]
        topo, verdict = info["topology"], info["verdict"]
        delta = verdict.get("delta")
        out.append([
            info["case"],
            f"{topo['nodes']} x {topo['devices_per_node']}",
            info["precision"],
            _batch(info),
            f"{_fmt(info['samples_per_s'])} {info.get('unit', 'samples')}/s",
            f"{_fmt(info['samples_per_s_min'])}-{_fmt(info['samples_per_s_max'])}",
            "-" if info.get("samples_per_s_cv") is None else f"{info['samples_per_s_cv']:.1%}",
            _count(info),
            _speedup(info.get("speedup"), info.get("scaling_efficiency")),
            _memory(info.get("peak_memory_bytes")),
            _utilization(info.get("achieved_flops_per_s"), info.get("mfu")),
            _fmt(verdict.get("baseline")),
            "-" if delta is None else f"{delta * 100:+.1f}%",
            verdict["text"],
        ])
    return out


def frameworks_side_by_side(benchmarks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """DLPerf's pivot: one row per case (test name and parameters, which the frameworks' perf
    files share), one column per framework: throughput (in the case's unit) and speedup. None
    for a single framework."""
    frameworks = list(dict.fromkeys(b["extra_info"]["framework"] for b in benchmarks))
    if len(frameworks) < 2:
        return None
    cases: dict[str, dict[str, Any]] = {}
    for bench in benchmarks:
        info = bench["extra_info"]
        row = cases.setdefault(bench["name"], {
            "case": bench["name"], "topology": info["topology"]["id"],
            "precision": info["precision"], "batch_size": _batch(info),
            "unit": f"{info.get('unit', 'samples')}/s"})
        row[info["framework"]] = {"samples_per_s": info["samples_per_s"],
                                  "speedup": info.get("speedup"),
                                  "verdict": info["verdict"]["text"]}
    return {"frameworks": frameworks, "rows": list(cases.values())}


def pivot_rows(pivot: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["case", "topology", "precision", "batch/dev", "unit",
              *(f"{fw} (speedup)" for fw in pivot["frameworks"])]
    table = []
    for row in pivot["rows"]:
        cells = []
        for fw in pivot["frameworks"]:
            figures = row.get(fw)
            if figures is None:
                cells.append("-")
                continue
            speedup = figures["speedup"]
            cells.append(_fmt(figures["samples_per_s"])
                         + ("" if speedup is None else f" ({speedup:.2f})"))
        table.append([row["case"], row["topology"], row["precision"], str(row["batch_size"]),
                      row.get("unit", "samples/s"), *cells])
    return header, table


def text_table(table: list[list[str]], header: list[str] = HEADER) -> list[str]:
    grid = [header, *table]
    widths = [max(len(r[i]) for r in grid) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in grid]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def markdown_table(table: list[list[str]], header: list[str] = HEADER) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in table]
    return lines


def html_main(argv: list[str]) -> int:
    from .changepoints import MAX_PVALUE
    from .history import History, HistoryError
    from .htmlreport import write

    parser = argparse.ArgumentParser(
        prog="python -m pytest_dlperf.report html",
        description="Write a static page of a history store (--dlperf-history) into a folder: "
                    "trends with their change points, scaling, frameworks side by side, "
                    "DLPerf's tables. It opens from disk; nothing is fetched at view time.")
    parser.add_argument("history", help="the store: an SQLite file's path or a postgresql:// "
                                        "URL, as given to --dlperf-history")
    parser.add_argument("-o", "--out", type=Path, default=Path("dlperf-report"),
                        help="the folder to write (index.html and plots/); default dlperf-report")
    parser.add_argument("--title", default="pytest-dlperf history")
    parser.add_argument("--change-pvalue", type=float, default=MAX_PVALUE,
                        help=f"a step counts at or below this p (default {MAX_PVALUE})")
    args = parser.parse_args(argv)
    if not 0 < args.change_pvalue < 1:
        parser.error(f"--change-pvalue: expected a p-value between 0 and 1, got "
                     f"{args.change_pvalue}")
    try:
        store = History.open(args.history, create=False)
    except HistoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        index = write(store, args.out, args.title, args.change_pvalue)
    except HistoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(f"wrote {index}")
    return 0


def main(argv: list[str] | None = None) -> int:
    import json

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["html"]:
        return html_main(argv[1:])

    parser = argparse.ArgumentParser(prog="python -m pytest_dlperf.report",
                                     description="Print a pytest-dlperf results file as a table.")
    parser.add_argument("results", type=Path, help="file written by --dlperf-json")
    parser.add_argument("--format", choices=("markdown", "text"), default="markdown")
    args = parser.parse_args(argv)
    try:
        data = json.loads(args.results.read_text())
        table = rows(data["benchmarks"])
        pivot = frameworks_side_by_side(data["benchmarks"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {args.results} is not a pytest-dlperf results file: {exc!r}", file=sys.stderr)
        return 2
    render = markdown_table if args.format == "markdown" else text_table
    failing = regressed(data["benchmarks"])
    if failing:
        print(f"Regressed ({len(failing)}):\n")
        print("\n".join(failing) + "\n")
    print("\n".join(render(table)) if table else "No pytest-dlperf cases ran.")
    if pivot is not None:
        header, side_by_side = pivot_rows(pivot)
        print("\nFrameworks side by side:\n")
        print("\n".join(render(side_by_side, header)))
    history = history_lines(data["benchmarks"])
    if history:
        print("\nChange points in the history (--dlperf-history):\n")
        print("\n".join(history))
    return 0


def regressed(benchmarks: list[dict[str, Any]]) -> list[str]:
    """The cases that failed on their figures: a regression of throughput, scaling efficiency
    or peak memory, or a step down in their history."""
    lines = []
    for bench in benchmarks:
        info = bench["extra_info"]
        what = [name for name, verdict in (("throughput", info["verdict"]),
                                           ("scaling efficiency", info.get("efficiency_verdict")),
                                           ("peak memory", info.get("memory_verdict")))
                if verdict and verdict.get("outcome") == "regression"]
        history = info.get("history") or {}
        if history.get("blocking") is not None:
            what.append("history: " + history["steps"][history["blocking"]]["text"])
        if what:
            lines.append(f"- `{info['case']}`: {'; '.join(what)}")
    return lines


def history_lines(benchmarks: list[dict[str, Any]]) -> list[str]:
    """Per case judged with --dlperf-history: its steps, the one that failed it marked."""
    lines = []
    for bench in benchmarks:
        info = bench["extra_info"]
        history = info.get("history")
        if not history or not history["steps"]:
            continue
        for i, step in enumerate(history["steps"]):
            if i == history["blocking"]:
                state = "**fails this run** (not accepted)"
            elif step["accepted"]:
                state = "accepted (a run since recorded the baseline)"
            else:
                state = "for the worse" if step["worse"] else "for the better"
            lines.append(f"- `{info['case']}` ({history['runs']} runs): {step['text']}: {state}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
