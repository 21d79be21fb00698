"""The baseline verdict by runs, on this machine: separate quiet reruns of an unchanged case
judged against a baseline of one run and against one of three runs (false regressions,
inconclusive verdicts, launches and wall time per run), then one run beside CPU hogs (how soon
a drop beyond doubt fails).

Usage::

    .venv/bin/python benchmarks/baseline_runs.py [--reruns 8] [--hogs 3]
        [-k "torch and resnet50 and 1n1d and fp32 and eager"] [--out DIR]

Method. Real pytest sessions of the repository's own perf tests (``perf_tests``, the quick
protocol, 3 launches a run), each a separate ``python -m pytest`` process with its own
``--dlperf-json``:

1. record the baseline once (``--dlperf-update-baselines``): the **one-run** store; copy it and
   add two more runs to the copy (``--dlperf-update-baselines=add``, each a session of its
   own): the **three-run** store;
2. ``--reruns`` reruns, each judged against both stores, one session each, the order
   alternating (one-run first, then three-run first, ...), so the machine's drift reaches both;
3. with ``--hogs`` busy processes (``while True: pass``, full priority) running, one session
   against the one-run store, timed by this script's clock.

Each session's verdict (outcome, level, launches taken) comes from its results JSON; wall time
is the session's, measured here. A benchmark, not a test: it prints what it measures and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def session(store: Path, out: Path, selection: str, *extra: str,
            timeout: float = 1800) -> dict[str, Any]:
    """One pytest session against ``store``; its cases' verdicts and its wall time."""
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:cacheprovider",
               "-k", selection, "--dlperf-protocol", "quick", "--dlperf-baselines", str(store),
               "--dlperf-json", str(out), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    begin = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - begin
    cases = []
    if out.exists():
        for bench in json.loads(out.read_text())["benchmarks"]:
            info = bench["extra_info"]
            verdict = info["verdict"]
            cases.append({"case": info["case"], "outcome": verdict["outcome"],
                          "level": verdict.get("level"), "launches": info["launches"],
                          "median": info["samples_per_s"], "delta": verdict.get("delta"),
                          "p": verdict.get("p_worse")})
    return {"rc": done.returncode, "wall_s": wall, "cases": cases, "at": time.time(),
            "tail": "" if cases else (done.stdout + done.stderr)[-2000:]}


def launches_alone(store: Path, result: Path) -> list[str]:
    """The same run judged as before runs counted: a t-test on the launches of both sides,
    taken as exchangeable, at the level of a verdict that may look 3 times (the old default)."""
    sys.path.insert(0, str(ROOT))
    from pytest_dlperf.verdict.stats import compare, look_alpha

    (stored,) = [json.loads(p.read_text()) for p in store.rglob("*.json")]
    base = stored["metrics"]["samples_per_s"]["launches"]
    return [compare(bench["extra_info"]["samples_per_s_launches"], base, 0.05,
                    alpha=look_alpha(3)).outcome
            for bench in json.loads(result.read_text())["benchmarks"]]


def show(name: str, runs: list[dict[str, Any]]) -> str:
    outcomes = [c["outcome"] for r in runs for c in r["cases"]]
    launches = [c["launches"] for r in runs for c in r["cases"]]
    deltas = [c["delta"] for r in runs for c in r["cases"] if c["delta"] is not None]
    walls = [r["wall_s"] for r in runs]
    count = {o: outcomes.count(o) for o in ("regression", "inconclusive", "pass", "improvement")}
    before = [o for r in runs for o in r.get("launches_alone", [])]
    return (f"| {name} | {len(runs)} | {count['regression']} | {count['inconclusive']} | "
            f"{count['pass'] + count['improvement']} | "
            f"{min(deltas):+.1%} .. {max(deltas):+.1%} | "
            f"{statistics.median(launches):g} ({min(launches)}-{max(launches)}) | "
            f"{statistics.median(walls):.0f} s ({min(walls):.0f}-{max(walls):.0f}) | "
            f"{before.count('regression')} regression, {before.count('inconclusive')} "
            "inconclusive |"
            if runs and deltas else f"| {name} | {len(runs)} | no verdicts |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reruns", type=int, default=8)
    parser.add_argument("--hogs", type=int, default=3, help="busy processes for the hog run "
                        "(0: no hog run)")
    parser.add_argument("-k", dest="selection",
                        default="torch and resnet50 and 1n1d and fp32 and eager")
    parser.add_argument("--out", type=Path, help="keep the stores and results JSON here")
    parser.add_argument("--rejudge", type=Path, help="print the table of an earlier --out "
                        "folder again, measuring nothing")
    args = parser.parse_args(argv)
    if args.rejudge:
        summary = json.loads((args.rejudge / "summary.json").read_text())
        table(args.rejudge, summary["reruns"], summary["hog"], summary.get("started", "?"),
              args)
        return 0
    work = args.out or Path(tempfile.mkdtemp(prefix="dlperf-baseline-runs-"))
    one, three = work / "one-run", work / "three-run"
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{started}: recording the baseline (1 run), then adding 2 runs to a copy", flush=True)
    recorded = [session(one, work / "record-1.json", args.selection,
                        "--dlperf-update-baselines")]
    shutil.copytree(one, three)
    for i in (2, 3):
        recorded.append(session(three, work / f"record-{i}.json", args.selection,
                                "--dlperf-update-baselines=add"))
    for r in recorded:
        print(f"  recorded: rc {r['rc']}, {r['wall_s']:.0f} s, "
              + ", ".join(f"{c['median']:.2f}" for c in r["cases"]) + (r["tail"] or ""),
              flush=True)
    against: dict[str, list[dict[str, Any]]] = {"one-run": [], "three-run": []}
    for i in range(args.reruns):
        order = ("one-run", "three-run") if i % 2 == 0 else ("three-run", "one-run")
        for name in order:
            got = session(work / name, work / f"rerun-{i + 1}-{name}.json", args.selection)
            against[name].append(got)
            print(f"  rerun {i + 1} vs {name}: rc {got['rc']}, {got['wall_s']:.0f} s, "
                  + ", ".join(f"{c['outcome']} ({c['level']}, {c['delta']:+.1%}, "
                              f"{c['launches']} launches)" for c in got["cases"])
                  + (got["tail"] or ""), flush=True)
    hog = None
    if args.hogs:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(args.hogs)]
        try:
            hog = session(one, work / "hog.json", args.selection)
        finally:
            for p in hogs:
                p.kill()
                p.wait()
    (work / "summary.json").write_text(json.dumps(
        {"started": started, "recorded": recorded, "reruns": against, "hog": hog},
        indent=1) + "\n")
    table(work, against, hog, started, args)
    print(f"\n(stores and results in {work})")
    return 0


def table(work: Path, against: dict[str, list[dict[str, Any]]], hog: dict[str, Any] | None,
          started: str, args: argparse.Namespace) -> None:
    for name, runs in against.items():
        for i, run in enumerate(runs):
            result = work / f"rerun-{i + 1}-{name}.json"
            if result.exists():
                run["launches_alone"] = launches_alone(work / name, result)
    print(f"\n{started}, {os.cpu_count()} cores; -k {args.selection!r}, quick protocol, "
          "3 launches a run\n")
    print("| baseline | reruns | regression | inconclusive | pass | delta range | "
          "launches per case | wall per run | the same launches judged alone |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for name, runs in against.items():
        print(show(name, runs))
    if hog is not None:
        hogs = getattr(args, "hogs", 3)
        for c in hog["cases"]:
            print(f"\nbeside {hogs} CPU hogs, against the one-run store: {c['outcome']} "
                  f"({c['level']}) at {c['median']:.3f} samples/s ({c['delta']:+.1%}) after "
                  f"{c['launches']} launch(es), session {hog['wall_s']:.0f} s")
        if not hog["cases"]:
            print(f"\nhog run: no verdict, rc {hog['rc']}: {hog['tail']}")


if __name__ == "__main__":
    sys.exit(main())
