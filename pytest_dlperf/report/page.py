"""``python -m pytest_dlperf html``: a static page of a history store, one folder that
opens from disk (no server, nothing fetched at view time, no script).

- **Trends**, per case and fingerprint: each run's median (the figure its verdict judged), the
  spread of its windows (min to max) and its launch medians, with the history's change points
  marked by their commit and size.
- **Phases**, per case beside its trend where any of its runs ran diagnostic steps: a bar per run
  of the seconds per step of each phase, stacked in the step's order (``phaseplot``).
- **Scaling**, per model and framework: a line per test of the tables' speedups against devices
  with the ideal line, as DLPerf's figures draw it.
- **Frameworks**, per model: bars of the newest median of each framework, row by row of the tables.
- **Tables**, DLPerf's: per model, a row per topology / precision / batch and test, a column
  per framework: throughput (speedup).

The series it shows, and the rows and tests its tables and figures share, are ``series``'s;
matplotlib draws the figures as SVG files beside ``index.html``.
"""

from __future__ import annotations

import datetime as dt
import html
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..store.history import History
from ..verdict.changepoints import MAX_PVALUE, MIN_CHANGE, Step, blocking
from .phaseplot import phase_plot, run_axis
from .series import Series, load, single_of, table_rows, tests_of

WORSE, BETTER, ACCEPTED = "#c0392b", "#1e8449", "#7f8c8d"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:80] or "case"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("error: the HTML report needs matplotlib: pip install "
                         "'pytest-dlperf[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
                         "svg.fonttype": "none"})
    return plt


def trend_plot(plt: Any, series: Series, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 2.8))
    xs = list(range(1, len(series.points) + 1))
    for x, point in zip(xs, series.points):
        values = point.values
        ax.vlines(x, min(values), max(values), color="#95a5a6", linewidth=3, alpha=0.6)
        for launch in point.launches:
            ax.plot(x, statistics.median(launch), ".", color="#7f8c8d", markersize=3)
    ax.plot(xs, [p.median for p in series.points], "o-", color="#2c3e50", markersize=4,
            linewidth=1, label="run median")
    top = max(max(p.values) for p in series.points)
    for step in series.steps:
        colour = ACCEPTED if step.accepted else (WORSE if step.worse else BETTER)
        at = step.point.index + 0.5
        ax.axvline(at, color=colour, linestyle="--", linewidth=1.2)
        commit = (step.first.commit_id or "")[:7] or "no commit"
        ax.annotate(f"{step.point.change:+.1%} at {commit}", (at, top), xytext=(3, -2),
                    textcoords="offset points", color=colour, fontsize=8, va="top")
    run_axis(ax, series.points)
    ax.set_ylabel(f"{series.unit}/s")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


Line = list[tuple[int, float]]  # (devices, speedup), 1 device first


def scaling_groups(all_series: list[Series]) -> dict[tuple[str, str], dict[str, Line]]:
    """(model, framework) -> a line per test, configuration and link the nodes had: the
    tables' speedups by devices, from 1 device (every link's start). Keyed by the configuration
    alone, two tests of one workload drew one line of both."""
    single, tests = single_of(all_series), tests_of(all_series, by_function=True)
    out: dict[tuple[str, str], dict[str, Line]] = {}
    for (model, devices, _, config, _), row in sorted(table_rows(all_series).items()):
        for fw, s in row.items():
            label = f"{tests[s.case]}: {config}"
            if devices > 1 and (base := single(s)):
                out.setdefault((model, fw), {}).setdefault(label, [(1, 1.0)]).append(
                    (devices, s.latest.median / base))
    return out


def scaling_plot(plt: Any, model: str, framework: str, lines: dict[str, Line],
                 path: Path) -> None:
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    most = max(d for line in lines.values() for d, _ in line)
    ax.plot([1, most], [1, most], "--", color="#7f8c8d", label="ideal")
    for config, line in lines.items():
        ax.plot([d for d, _ in line], [s for _, s in line], "o-", label=config)
    ax.set_xticks(sorted({d for line in lines.values() for d, _ in line}))
    ax.set_xlabel("devices")
    ax.set_ylabel("speedup over 1 device")
    ax.set_title(f"{model}, {framework}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def comparison_groups(all_series: list[Series]) -> dict[str, dict[str, dict[str, float]]]:
    """model -> a row of the tables (topology, precision, batch; its test on a second line) ->
    framework -> newest median."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (model, _, topology, config, test), row in sorted(table_rows(all_series).items()):
        out.setdefault(model, {})[f"{topology} {config}\n{test}"] = {
            fw: s.latest.median for fw, s in row.items()}
    return out


def comparison_plot(plt: Any, model: str, unit: str, cases: dict[str, dict[str, float]],
                    path: Path) -> None:
    frameworks = sorted({fw for row in cases.values() for fw in row})
    labels = list(cases)
    width = 0.8 / max(1, len(frameworks))
    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 * len(labels) + 2), 3.2))
    for i, fw in enumerate(frameworks):
        xs = [j + (i - (len(frameworks) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, [cases[c].get(fw, 0) for c in labels], width, label=fw)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel(f"{unit}/s (newest run)")
    ax.set_title(model)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _step_text(step: Step) -> str:
    if step.accepted:
        state, colour = "accepted: a run since recorded the baseline", ACCEPTED
    elif step.worse:
        state, colour = "for the worse, not accepted", WORSE
    else:
        state, colour = "for the better", BETTER
    return (f'<li style="color:{colour}">{html.escape(step.describe())} '
            f"<em>({state})</em></li>")


def dlperf_tables(all_series: list[Series]) -> str:
    """DLPerf's tables: per model, a row per ``table_rows`` row, a column per framework."""
    parts, rows, single = [], sorted(table_rows(all_series).items()), single_of(all_series)
    for model in sorted({s.model for s in all_series}):
        members = [s for s in all_series if s.model == model]
        frameworks = sorted({s.framework for s in members})
        table = [[html.escape(topology), html.escape(config), html.escape(test),
                  *(_cell(cells[fw], single(cells[fw])) if fw in cells else "-"
                    for fw in frameworks)]
                 for (of, _, topology, config, test), cells in rows if of == model]
        parts.append(f"<h3>{html.escape(model)} ({html.escape(members[0].unit)}/s, speedup "
                     f"over 1 device)</h3>" + _table(["nodes x devices",
                                                      "precision, batch/device", "test",
                                                      *frameworks], table))
    return "\n".join(parts)


def _cell(s: Series, single: float | None) -> str:
    cell = f"{s.latest.median:,.2f}"
    if single and s.devices > 1:
        cell += f" ({s.latest.median / single:.2f}x)"
    return cell


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2em; } .meta { color: #666; margin-top: 0; }
section.case { border-top: 1px solid #ddd; padding: 0.6em 0; }
img { max-width: 100%; } .figures { display: flex; flex-wrap: wrap; gap: 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child, td:nth-child(2), td:nth-child(3) { text-align: left; }
code { font-size: 0.9em; } .ok { color: #1e8449; } .bad { color: #c0392b; font-weight: bold; }
"""


def _case_sections(plt: Any, all_series: list[Series], plots: Path) -> tuple[list[str], list[str]]:
    """Each case's trend, the cases that sit after an unaccepted step down first; and the
    list of those ("Needs a look")."""
    cases, attention = [], []
    ordered = sorted(all_series, key=lambda s: (blocking(s.steps, MIN_CHANGE) is None, s.model,
                                                s.framework, s.case))
    for n, s in enumerate(ordered, 1):
        name = f"trend-{n:03d}-{_slug(s.case)}.svg"
        trend_plot(plt, s, plots / name)
        phased = f"phases-{n:03d}-{_slug(s.case)}.svg"
        phases = (f'<img src="plots/{phased}" alt="phases of {html.escape(s.case)} per run">'
                  if phase_plot(plt, s.points, s.phases, plots / phased) else "")
        step = blocking(s.steps, MIN_CHANGE)
        if step is not None:
            attention.append(f'<li><a href="#{_slug(s.case)}-{n}"><code>{html.escape(s.case)}'
                             f"</code></a>: {html.escape(step.describe())}</li>")
        status = ('<span class="bad">sits after a step for the worse</span>' if step
                  else '<span class="ok">no unaccepted step down</span>')
        found = ("<ul>" + "".join(_step_text(step) for step in s.steps) + "</ul>"
                 if s.steps else "<p>No change point.</p>")
        latest = s.latest
        cases.append(
            f'<section class="case" id="{_slug(s.case)}-{n}"><h3><code>{html.escape(s.case)}'
            f"</code></h3>"
            f'<p class="meta">{html.escape(s.framework)} {html.escape(str(s.fingerprint.get("framework_version", "")))}, '
            f"{html.escape(s.topology)}, {html.escape(s.config)}; {len(s.points)} runs, newest "
            f"{latest.median:,.2f} {html.escape(s.unit)}/s on "
            f"{latest.started_at.strftime('%Y-%m-%d %H:%M')} UTC "
            f"({html.escape((latest.commit_id or 'no commit')[:7])}); {status}</p>"
            f'<img src="plots/{name}" alt="trend of {html.escape(s.case)}">{phases}{found}'
            "</section>")
    return cases, attention


def _figures(plt: Any, all_series: list[Series], plots: Path) -> tuple[list[str], list[str]]:
    """The scaling plots (a model and framework over topologies) and the frameworks plots (a
    model in more than one framework)."""
    scaling = []
    for (model, framework), lines in sorted(scaling_groups(all_series).items()):
        name = f"scaling-{_slug(model)}-{_slug(framework)}.svg"
        scaling_plot(plt, model, framework, lines, plots / name)
        scaling.append(f'<img src="plots/{name}" alt="scaling of {html.escape(model)} with '
                       f'{html.escape(framework)}">')
    comparison = []
    for model, rows in sorted(comparison_groups(all_series).items()):
        if len({fw for row in rows.values() for fw in row}) < 2:
            continue
        unit = next(s.unit for s in all_series if s.model == model)
        name = f"frameworks-{_slug(model)}.svg"
        comparison_plot(plt, model, unit, rows, plots / name)
        comparison.append(f'<img src="plots/{name}" alt="frameworks on {html.escape(model)}">')
    return scaling, comparison


def write(history: History, out: Path, title: str = "pytest-dlperf history",
          max_pvalue: float = MAX_PVALUE) -> Path:
    """Write the page and its figures into ``out``; the path of ``index.html``."""
    plt = _pyplot()
    all_series = load(history, max_pvalue)
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    for old in plots.glob("*.svg"):
        old.unlink()
    cases, attention = _case_sections(plt, all_series, plots)
    scaling, comparison = _figures(plt, all_series, plots)
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="meta">{len(all_series)} case(s) from <code>{html.escape(history.shown)}</code>,
generated {generated}. Change points: E-Divisive means with a t-test, p &le; {max_pvalue:g}.</p>
<h2>Needs a look</h2>
{("<ul>" + "".join(attention) + "</ul>") if attention else
 "<p>No case sits after an unaccepted step down.</p>"}
<h2>Tables (newest run of each case)</h2>
{dlperf_tables(all_series) or "<p>No runs.</p>"}
<h2>Scaling</h2>
<div class="figures">{"".join(scaling) or "<p>No case ran on more than one topology.</p>"}</div>
<h2>Frameworks</h2>
<div class="figures">{"".join(comparison) or "<p>No model ran in more than one framework.</p>"}</div>
<h2>Trends</h2>
{"".join(cases) or "<p>The history is empty.</p>"}
</body></html>
"""
    index = out / "index.html"
    index.write_text(page)
    return index
