"""``--dlperf-batch-size max`` on the built-in models: the batch each framework fits under a
per-rank memory limit, the search's probes and time, and the case measured at that batch.

Usage::

    .venv/bin/python benchmarks/batch_search.py [--cases resnet50:torch:1G,bert:torch:3G,...]
        [--oneflow-python .venv-oneflow/bin/python] [--steps 3]

Each case is one ``python -m pytest perf_tests`` run of that model's 1n1d fp32 eager case on
this machine's device with ``--dlperf-batch-size max --dlperf-memory-limit LIMIT`` (the OS
enforces the limit: a memory cgroup of the rank's own, else an address-space limit), into a
scratch baseline folder (no earlier answer: the search starts from the profile's batch). A probe
is a fresh launch training 3 steps; the measurement after it is 2 warm-up steps and one window
of ``--steps`` steps. Reads the results file and prints, per case: the probes in order (batch,
fitted or not, seconds), the batch found, the search's time, the measurement's samples/s, its
peak memory (the rank's peak RSS on CPU) and achieved FLOP/s. Exits non-zero if a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ("resnet50:torch:1G,resnet50:tensorflow:1536M,resnet50:oneflow:1G,"
                 "bert:torch:3G")
TESTS = {"resnet50": "test_resnet50", "bert": "test_bert_base"}


def one_case(work: Path, model: str, framework: str, limit: str, steps: int,
             oneflow_python: str | None) -> dict:  # type: ignore[type-arg]
    out = work / f"{model}-{framework}.json"
    cmd = [sys.executable, "-m", "pytest", str(REPO / "perf_tests"), "-q", "-p",
           "no:cacheprovider", "-k", f"{TESTS[model]} and {framework} and 1n1d-fp32-eager",
           "--dlperf-batch-size", "max", "--dlperf-memory-limit", limit,
           "--dlperf-warmup-steps", "2", "--dlperf-steps", str(steps), "--dlperf-repeats", "1",
           "--dlperf-max-repeats", "1", "--dlperf-launches", "1", "--dlperf-unstable-cv", "10",
           "--dlperf-baselines", str(work / f"baselines-{model}-{framework}"),
           "--dlperf-json", str(out)]
    if oneflow_python:
        cmd += ["--dlperf-python", f"oneflow={oneflow_python}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{model} {framework} failed:\n{proc.stdout[-4000:]}"
                           f"{proc.stderr[-2000:]}")
    (bench,) = json.loads(out.read_text())["benchmarks"]
    info: dict[str, Any] = bench["extra_info"]
    info["wall_s"] = wall
    return info


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2 ** 30:.2f} GiB"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES,
                        help="model:framework:limit, comma-separated (default: %(default)s)")
    parser.add_argument("--oneflow-python", default=str(REPO / ".venv-oneflow/bin/python"),
                        help="OneFlow's interpreter (scripts/setup-oneflow's by default)")
    parser.add_argument("--steps", type=int, default=3,
                        help="steps of the measurement's one window (default: %(default)s)")
    args = parser.parse_args(argv)
    cases = []
    for item in args.cases.split(","):
        try:
            model, framework, limit = item.split(":")
        except ValueError:
            parser.error(f"--cases: expected model:framework:limit, got {item!r}")
        if model not in TESTS:
            parser.error(f"--cases: model {model!r} is not one of {', '.join(TESTS)}")
        cases.append((model, framework, limit))
    oneflow = args.oneflow_python if os.access(args.oneflow_python, os.X_OK) else None
    rows = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="dlperf-batch-search-") as tmp:
        for model, framework, limit in cases:
            if framework == "oneflow" and oneflow is None:
                print(f"{model} {framework}: skipped, no OneFlow interpreter at "
                      f"{args.oneflow_python} (scripts/setup-oneflow)", flush=True)
                continue
            try:
                info = one_case(Path(tmp), model, framework, limit, args.steps, oneflow)
            except RuntimeError as exc:
                print(exc, flush=True)
                failed = True
                continue
            search = info["batch_search"]
            probes = " ".join(f"{p['batch']}{'+' if p['fits'] else 'x'}"
                              f"{'(m)' if p['stage'] == 'measurement' else ''}"
                              for p in search["probes"])
            rate = info["samples_per_s"]
            achieved = info.get("achieved_flops_per_s")
            rows.append((f"{model}, {framework}", limit, probes, str(search["found"]),
                         f"{len(search['probes'])} in {search['seconds']:.0f} s",
                         f"{rate:.1f} {info.get('unit', 'samples')}/s",
                         gib(info.get("peak_memory_bytes")),
                         "-" if achieved is None else f"{achieved / 1e9:.1f} GFLOP/s",
                         f"{info['wall_s']:.0f} s"))
            print(f"{model} {framework}: found {search['found']} ({probes})", flush=True)
    header = ("case", "limit", "probes (+ fitted, x out of memory)", "found", "probes, time",
              "at the found batch", "peak memory", "achieved", "whole run")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
