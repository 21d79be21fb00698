"""The command line: ``python -m pytest_dlperf COMMAND`` or ``dlperf COMMAND``.

- ``report RESULTS.json``: a results file (``--dlperf-json``) as tables, Markdown by default
  (a CI job summary);
- ``html STORE -o DIR``: the history's static page;
- ``history add FILE URL``: append a run the history store could not take when it ran;
- ``options``: the options reference (flags, environment variables, ini keys);
- ``nightly run|accept|status``: the nightly gate (A/B against the last good commit, then the
  baselines and the history; ``nightly/``);
- ``slurm start N`` / ``stop`` / ``status`` / ``run -- CMD``: a real Slurm cluster on this
  machine, each node its own network host (root; ``launch/slurm/cluster.py``).
- ``ray start N`` / ``stop`` / ``status`` / ``run -- CMD``: a real Ray cluster on this machine,
  a head and N worker nodes, each its own network host (root; ``launch/ray/cluster.py``).

Running perf tests is pytest's job (``pytest perf_tests``); these commands read what runs left.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROG = "dlperf"


def _report(args: argparse.Namespace) -> int:
    from .report.tables import (
        AB_HEADER,
        BUSY_HEADER,
        ab_code_lines,
        ab_rows,
        busy_rows,
        frameworks_side_by_side,
        history_lines,
        markdown_table,
        pivot_rows,
        regressed,
        rows,
        text_table,
    )

    try:
        data = json.loads(args.results.read_text())
        table = rows(data["benchmarks"])
        pivot = frameworks_side_by_side(data["benchmarks"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {args.results} is not a pytest-dlperf results file: {exc!r}",
              file=sys.stderr)
        return 2
    render = markdown_table if args.format == "markdown" else text_table
    failing = regressed(data["benchmarks"])
    if failing:
        print(f"Regressed ({len(failing)}):\n")
        print("\n".join(failing) + "\n")
    busy = busy_rows(data.get("dlperf_not_judged") or [])
    if table or not busy:
        print("\n".join(render(table)) if table else "No pytest-dlperf cases ran.")
    if busy:
        print(f"\nNot judged, the machine was busy ({len(busy)}): what they measured, the "
              "machine's figures, not the code's:\n")
        print("\n".join(render(busy, BUSY_HEADER)))
    sides, ab_table = ab_rows(data["benchmarks"])
    if ab_table:
        print(f"\nA/B, head against base ({sides}):\n")
        print("\n".join([*render(ab_table, AB_HEADER), *ab_code_lines(data["benchmarks"])]))
    if pivot is not None:
        header, side_by_side = pivot_rows(pivot)
        print("\nFrameworks side by side:\n")
        print("\n".join(render(side_by_side, header)))
    history = history_lines(data["benchmarks"])
    if history:
        print("\nChange points in the history (--dlperf-history):\n")
        print("\n".join(history))
    return 0


def _html(args: argparse.Namespace) -> int:
    from .report.page import write
    from .store.history import History, HistoryError

    if not 0 < args.change_pvalue < 1:
        args.parser.error(f"--change-pvalue: expected a p-value between 0 and 1, got "
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


def _history_add(args: argparse.Namespace) -> int:
    from .store.history import History, HistoryError
    from .store.history_rows import load_unsaved

    try:
        run, cases = load_unsaved(args.file)
    except (OSError, ValueError, KeyError) as exc:
        args.parser.error(f"{args.file}: not a saved run ({exc})")
    try:
        store = History.open(args.url)
        run_id = store.append(run, cases)
    except HistoryError as exc:
        print(f"pytest-dlperf: {exc}", file=sys.stderr)
        return 1
    print(f"appended run {run_id} ({len(cases)} case(s)) to {store.shown}")
    return 0


def _options(args: argparse.Namespace) -> int:
    from .plugin.options import options_markdown

    print(options_markdown())
    return 0


def _bisect(args: argparse.Namespace) -> int:
    from .bisect import main as bisect

    command = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    return bisect(args.good, args.bad, command)


def _nightly(args: argparse.Namespace) -> int:
    from .nightly import main as nightly

    command = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    if args.action == "run" and "--" in command:  # run [--bisect] -- PYTEST-ARGS
        own, command = command[:command.index("--")], command[command.index("--") + 1:]
        run = argparse.ArgumentParser(prog=f"{PROG} nightly run")
        run.add_argument("--bisect", action="store_true")
        args.bisect = run.parse_args(own).bisect or args.bisect
    if args.action == "accept":  # accept [REV] [--by NAME], in the tests' repository
        accept = argparse.ArgumentParser(prog=f"{PROG} nightly accept")
        accept.add_argument("revision", nargs="?", default="HEAD")
        accept.add_argument("--by")
        given = accept.parse_args(command)
        return nightly("accept", [], revision=given.revision, who=given.by or args.by)
    return nightly(args.action, command, bisect=args.bisect)


def _keep(args: argparse.Namespace) -> int:
    """``dlperf slurm`` and ``dlperf ray``: a local cluster, through its keeper."""
    from .launch.onehost import keeper

    if args.kind == "ray":
        from .launch.ray.keeper import KIND
    else:
        from .launch.slurm.keeper import KIND
    state = args.state.absolute()
    if args.action in ("start", "serve") and args.nodes < 1:
        args.parser.error(f"nodes: expected 1 or more, got {args.nodes}")
    if args.action == "start":
        return keeper.start(KIND, args.nodes, state)
    if args.action == "serve":
        return keeper.serve(KIND, args.nodes, state)
    if args.action == "run":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return keeper.run(KIND, state, command)
    return int(getattr(keeper, args.action)(KIND, state))


def _nightly_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    nightly = sub.add_parser(
        "nightly", help="the nightly gate: A/B against the last good commit, then the "
                        "baselines and the history (docs/nightly.md)",
        description="run: tonight's tests as an A/B run against the last night that passed "
                    "(--dlperf-ab-mode auto), then against the runner's baselines and history; "
                    "the night fails where a judge proves a slowdown, and moves the last good "
                    "commit where it passes. accept [REV]: a person moves the last good commit "
                    "(default HEAD). status: print it. The store: DLPERF_NIGHTLY_STORE, "
                    "DLPERF_MACHINE, DLPERF_NIGHTLY_HISTORY, DLPERF_NIGHTLY_OUT.")
    nightly.add_argument("action", choices=("run", "accept", "status"))
    nightly.add_argument("--bisect", action="store_true",
                         help="run: on an A/B failure over more than one commit, bisect them")
    nightly.add_argument("--by", help="accept: who accepted the change (default: $USER)")
    nightly.add_argument("pytest_args", nargs=argparse.REMAINDER,
                         help="run: -- then pytest's arguments, the tests (their paths) and "
                              "options; accept: the commit (default HEAD)")
    nightly.set_defaults(run=_nightly, parser=nightly)


def _keeper_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], kind: str,
                   default_state: Path, about: str, nodes: str, login: str,
                   example: str) -> None:
    """``dlperf slurm`` / ``dlperf ray``: start, stop, status and run on a local cluster."""
    cluster = sub.add_parser(kind, help=f"a real {about} on this machine (root)",
                             description=f"A {about} on this machine: {nodes}, each node its own "
                                         "network host. Needs root.")
    actions = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--state", type=Path, default=default_state,
                       help=f"the cluster's folder (everything of it; default {default_state})")
    start = f"start N nodes and their {login}, in the background"
    for action in (actions.add_parser("start", parents=[state], help=start, description=start),
                   # the background process `start` runs (given no help: not listed)
                   actions.add_parser("serve", parents=[state])):
        action.add_argument("nodes", type=int, help="how many nodes (node1, node2, ...)")
    actions.add_parser("stop", parents=[state], help="stop it: every daemon, namespace, link")
    actions.add_parser("status", parents=[state], help="its daemons, how to use it")
    run = actions.add_parser("run", parents=[state],
                             help=f"run a command on the {login}'s host",
                             description=f"Run COMMAND on the {login}'s host: {example}")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    cluster.set_defaults(run=_keep, parser=cluster, kind=kind)


def parser() -> argparse.ArgumentParser:
    from .verdict.changepoints import MAX_PVALUE

    top = argparse.ArgumentParser(
        prog=PROG, description="pytest-dlperf's commands (also `python -m pytest_dlperf`). "
        "Perf tests themselves run under pytest: `pytest perf_tests`.")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    report = sub.add_parser("report", help="print a results file (--dlperf-json) as tables",
                            description="Print a pytest-dlperf results file as tables.")
    report.add_argument("results", type=Path, help="file written by --dlperf-json")
    report.add_argument("--format", choices=("markdown", "text"), default="markdown")
    report.set_defaults(run=_report)

    html = sub.add_parser(
        "html", help="write the history's static page",
        description="Write a static page of a history store (--dlperf-history) into a folder: "
                    "trends with their change points, scaling, frameworks side by side, "
                    "DLPerf's tables. It opens from disk; nothing is fetched at view time.")
    html.add_argument("history", help="the store: an SQLite file's path or a postgresql:// "
                                      "URL, as given to --dlperf-history")
    html.add_argument("-o", "--out", type=Path, default=Path("dlperf-report"),
                      help="the folder to write (index.html and plots/); default dlperf-report")
    html.add_argument("--title", default="pytest-dlperf history")
    html.add_argument("--change-pvalue", type=float, default=MAX_PVALUE,
                      help=f"a step counts at or below this p (default {MAX_PVALUE})")
    html.set_defaults(run=_html, parser=html)

    history = sub.add_parser("history", help="work on a history store",
                             description="Work on a history store (--dlperf-history).")
    history_sub = history.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = history_sub.add_parser(
        "add", help="append a saved run to a history store",
        description="Append a run that could not be saved (the file a session wrote when the "
                    "store failed it) once the store is back.")
    add.add_argument("file", type=Path, help="the dlperf-history-unsaved-*.json file")
    add.add_argument("url", help="the store: an SQLite file's path or a postgresql:// URL")
    add.set_defaults(run=_history_add, parser=add)

    options = sub.add_parser("options", help="print the options reference (Markdown)",
                             description="Print every option: flag, environment variable, ini "
                                         "key and help, as the documentation's options page.")
    options.set_defaults(run=_options)
    bisect = sub.add_parser(
        "bisect", help="find the first commit that made cases slower (A/B probes)",
        description="Binary search over the first-parent commits after GOOD up to BAD: each "
                    "probe runs the selected cases as an A/B run (--dlperf-ab GOOD) in a "
                    "worktree of the probe commit, and is slow when a case's paired verdict is "
                    "a regression. Ends with 'first slow commit: SHA SUBJECT'.")
    bisect.add_argument("good", help="a commit whose cases are not slow (the base of every probe)")
    bisect.add_argument("bad", help="a later commit whose cases are slow")
    bisect.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="-- then pytest's arguments: the tests and options of each probe")
    bisect.set_defaults(run=_bisect, parser=bisect)
    _nightly_parser(sub)
    _clusters_parsers(sub)
    return top


def _clusters_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _keeper_parser(sub, "slurm", Path("/tmp/dlperf-slurm"), "Slurm cluster",
                   "munged, slurmctld and N slurmd (Debian's slurmd slurmctld slurm-client "
                   "munge)", "controller", "dlperf slurm run -- salloc -N 2 pytest ...")
    _keeper_parser(sub, "ray", Path("/tmp/dlperf-ray"), "Ray cluster",
                   "a head and N worker nodes (ray start, Ray installed beside pytest)", "head",
                   "dlperf ray run -- pytest perf_tests -m multinode --nodes 2 "
                   "--dlperf-launcher ray")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.run(args))
