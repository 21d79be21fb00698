"""The summary tables, rendered from the results JSON (``report.results``): one row per case
(terminal or Markdown), DLPerf's frameworks side by side, the cases that regressed and the
change points their history found. ``python -m pytest_dlperf report results.json`` prints them
as Markdown, for a CI job summary."""

from __future__ import annotations

from typing import Any

from ..core.units import format_bytes, format_flops

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


def _speedup(speedup: float | None, efficiency: float | None,
             model: dict[str, Any] | None = None) -> str:
    """Speedup (efficiency), and the scaling model's efficiency beside it where there is one
    (docs/phases.md)."""
    if speedup is None or efficiency is None:
        return "-"
    predicted = f"; model {model['predicted_efficiency']:.0%}" if model else ""
    return f"{speedup:.2f} ({efficiency:.0%}{predicted})"


def _batch(info: dict[str, Any]) -> str:
    """The per-device batch; a searched one as ``max=N``."""
    if info.get("batch_size_requested") == "max":
        return f"max={info['batch_size']}"
    return str(info["batch_size"])


def _utilization(info: dict[str, Any]) -> str:
    """Achieved FLOP/s per device, and MFU where the device's peak is known."""
    achieved, mfu = info.get("achieved_flops_per_s"), info.get("mfu")
    if achieved is None:
        return "-"
    text = format_flops(achieved)
    return text if mfu is None else f"{text} ({mfu:.1%})"


def rows(benchmarks: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for bench in benchmarks:
        info = bench["extra_info"]
        topo, verdict = info["topology"], info["verdict"]
        delta = verdict.get("delta")
        ab = info.get("ab") or {}
        if ab.get("ratio"):  # A/B: the pairs' ratio, the A/B table's figure, not the medians'
            delta = ab["ratio"] - 1
        out.append([
            info["case"],
            f"{topo['nodes']} x {topo['devices_per_node']}",
            info["precision"],
            _batch(info),
            f"{_fmt(info['samples_per_s'])} {info.get('unit', 'samples')}/s",
            f"{_fmt(info['samples_per_s_min'])}-{_fmt(info['samples_per_s_max'])}",
            "-" if info.get("samples_per_s_cv") is None else f"{info['samples_per_s_cv']:.1%}",
            _count(info),
            _speedup(info.get("speedup"), info.get("scaling_efficiency"),
                     info.get("scaling_model")),
            format_bytes(info.get("peak_memory_bytes")),
            _utilization(info),
            _fmt(verdict.get("baseline")),
            "-" if delta is None else f"{delta * 100:+.1f}%",
            verdict["text"],
        ])
    return out


BUSY_HEADER = ["case", "launches", "throughput (median)", "min-max", "windows",
               "others' CPU (last launch)", "verdict"]


def busy_rows(unjudged: list[dict[str, Any]]) -> list[list[str]]:
    """What cases left unjudged beside a busy machine measured (``NotJudged.to_json``): shown,
    marked, never judged."""
    out = []
    for case in unjudged:
        measured = case.get("measured")
        if not measured:
            continue
        windows = [w for launch in measured["launches"] for w in launch]
        unit = f" {measured['unit']}/s"
        others = case["interference"].get("others_cpu")
        out.append([case["case"], str(len(measured["launches"])),
                    _fmt(measured["median"]) + unit,
                    f"{_fmt(min(windows))}-{_fmt(max(windows))}", str(len(windows)),
                    "-" if others is None else f"{others:.0%}",
                    f"not judged: machine busy in {case['launch']}"])
    return out


def mfu_notes(benchmarks: list[dict[str, Any]]) -> list[str]:
    """Why cases have no MFU, a line per reason naming its cases (three, then a count); and
    what a CPU case's MFU was taken against (a core's peak x the rank's threads), a line per
    peak."""
    by_reason: dict[str, list[str]] = {}
    by_peak: dict[str, list[str]] = {}
    for bench in benchmarks:
        info = bench["extra_info"]
        if info.get("mfu_missing"):
            by_reason.setdefault(info["mfu_missing"], []).append(info["case"])
        peak = info.get("mfu_peak") or {}
        if info.get("mfu") is not None and peak.get("per_core_flops_per_s"):
            how = (f"{peak['per_core_flops_per_s'] / 1e9:,.1f} GFLOP/s a core at "
                   f"{peak['precision']} x {peak['cores']} thread(s) a rank, "
                   + (f"a dense GEMM measured here ({peak['measured']}; not the hardware's "
                      "peak)" if peak.get("measured") else "--dlperf-peak-flops's"))
            by_peak.setdefault(how, []).append(info["case"])
    lines = []
    for why, cases in by_reason.items():
        lines.append(f"pytest-dlperf: no MFU for {_named(cases)}: {why}")
    for how, cases in by_peak.items():
        lines.append(f"pytest-dlperf: MFU of {_named(cases)} against {how}")
    return lines


def search_notes(benchmarks: list[dict[str, Any]]) -> list[str]:
    """Under the table, what each ``max`` search found: the value (a size's is in no column),
    its probes and their time, where the budget cut it short, and a measurement that ran out
    of memory at the value found (stepped down, or a launch run again)."""
    lines = []
    for bench in benchmarks:
        info = bench["extra_info"]
        for key in ("batch_search", "size_search"):
            found = info.get(key)
            if not found:
                continue
            size = found.get("size", "batch_size")
            name = "batch" if size == "batch_size" else size
            flag = ("--dlperf-batch-size max" if size == "batch_size"
                    else f"--dlperf-size {size}=max")
            probes = [p for p in found.get("probes", []) if p.get("stage") == "probe"]
            key_of = "batch" if size == "batch_size" else "value"
            text = (f"pytest-dlperf: {info['case']}: {flag} found {name} {found['found']:,} "
                    f"in {len(probes)} probe(s), {found.get('seconds', 0):.0f} s"
                    + (" (from an earlier run's value)" if found.get("seeded") else ""))
            if found.get("capped"):
                text += "; every probe fitted up to the search's cap"
            if found.get("budget_spent"):
                unsettled = found.get("unsettled")
                text += (f"; the search's budget ({found['budget_s']:g} s, "
                         f"--dlperf-search-budget) ran out: the largest that fitted"
                         + (f", {unsettled:,} did not" if unsettled else ""))
            stepped = [p[key_of] for p in found.get("probes", [])
                       if p.get("stage") == "measurement"]
            rerun = [p for p in found.get("probes", []) if p.get("stage") == "measurement, rerun"]
            if stepped:
                text += (f"; measured at {found['found']:,} after running out of memory at "
                         f"{', '.join(f'{v:,}' for v in stepped)}")
            if rerun:
                text += (f"; {len(rerun)} launch(es) ran out of memory there and ran again, "
                         "the launches that fitted kept")
            lines.append(text)
    return lines


def table_notes(benchmarks: list[dict[str, Any]]) -> list[str]:
    """The lines under the throughput table: MFU's, then the searches'."""
    return [*mfu_notes(benchmarks), *search_notes(benchmarks)]


def _named(cases: list[str]) -> str:
    return ", ".join(cases[:3]) + (f" and {len(cases) - 3} more" if len(cases) > 3 else "")


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


AB_HEADER = ["case", "base", "head", "head/base", "interval", "pairs", "p", "efficiency base -> head",
             "verdict", "phases head/base"]


def phase_ratios(phases: dict[str, Any] | None) -> str:
    """``backward 1.12x, forward 1.00x, ...``: each phase both sides measured, head's seconds
    per step over base's, in head's step order; "-" where a side ran no diagnostic steps."""
    base, head = (phases or {}).get("base"), (phases or {}).get("head")
    if not base or not head:
        return "-"
    before, after = base["seconds_per_step"], head["seconds_per_step"]
    order = head.get("order") or list(after)
    return ", ".join(f"{name} {after[name] / before[name]:.2f}x" for name in order
                     if name in after and before.get(name)) or "-"


def ab_rows(benchmarks: list[dict[str, Any]]) -> tuple[str, list[list[str]]]:
    """The A/B table (--dlperf-ab, --dlperf-ab-python): each side's median, the paired ratio
    with its interval, the pairs, each phase's ratio; and what the base side was."""
    table, base = [], ""
    for bench in benchmarks:
        info = bench["extra_info"]
        ab = info.get("ab")
        if not ab:
            continue
        builds = {side: ab.get(f"{side}_framework_version") for side in ("base", "head")}
        base, head = ((f"{ab[side]} ({info['framework']} {builds[side]})" if builds[side]
                       else ab[side]) for side in ("base", "head"))
        base = f"base: {base}; head: {head}"
        unit = f" {info['unit']}/s"
        ci = ab.get("ratio_ci")
        p = ab["p_better"] if ab["outcome"] == "improvement" else ab["p_worse"]
        efficiency = ab.get("efficiency") or {}
        table.append([
            info["case"], _fmt(ab["base_median"]) + unit, _fmt(ab["head_median"]) + unit,
            f"{ab['ratio']:.3f}" if ab.get("ratio") else "-",
            f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-", str(len(ab["pairs"])),
            f"{p:.2g}" if p is not None else "-",
            (f"{efficiency['base']:.1%} -> {efficiency['head']:.1%}"
             if "base" in efficiency and "head" in efficiency else "-"),
            ab["outcome"], phase_ratios(ab.get("phases"))])
    return base, table


def ab_code_lines(benchmarks: list[dict[str, Any]]) -> list[str]:
    """Under the A/B table: where each side's ranks imported the tests' repository's code from
    (``ab.code``), and what is the same on both sides; each line once."""
    lines: list[str] = []
    for bench in benchmarks:
        code = (bench["extra_info"].get("ab") or {}).get("code") or {}
        for side in ("base", "head"):
            facts = code.get(side)
            if not facts:
                continue
            taken = "; ".join(facts.get("taken") or []) or "nothing of the repository"
            built = f"; {facts['built']}" if facts.get("built") else ""
            lines.append(f"{side}'s code, from {facts['tree']}: {taken}{built}")
        same = {line for side in ("base", "head") for line in (code.get(side) or {}).get(
            "same", [])}
        lines += [f"the same on both sides: {line}" for line in sorted(same)]
        threads = (bench["extra_info"].get("ab") or {}).get("threads") or {}
        if threads.get("per_rank") and threads["per_rank"] != threads.get("asked"):
            how = (f"in duet each side had {threads['cores_a_side']} core(s)"
                   if threads.get("cores_a_side") else "the host was busy when it began")
            lines.append(
                f"threads: {how}, so both ran {threads['per_rank']} thread(s) a rank, not the "
                f"{threads['asked']} a case run alone takes: the A/B figures compare head with "
                f"base, not with the baselines' or another run's table")
    return list(dict.fromkeys(lines))
