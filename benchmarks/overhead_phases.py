"""What the diagnostic steps (issue 41, docs/phases.md) cost a case: its wall time with
``--dlperf-phases on`` against ``off``, in one run.

Usage::

    .venv/bin/python benchmarks/overhead_phases.py [--rounds 3] [--protocol quick]
        [-k "resnet50 and torch and fp32 and eager and (1n1d or 1n2d)"]

Method. ``pytest perf_tests`` in a subprocess, the selected cases (default: torch ResNet-50 fp32
eager at 1n1d and 1n2d, the CPU profile) under the chosen protocol, three launches per case,
``--dlperf-json`` giving each case's ``wall_s`` (its launches, process start-up included; the
1n1d reference a 1n2d case may measure is not in it). The two settings alternate round after
round and the order flips every round (on, off, off, on, ...), so this VM's drift over minutes
hits both alike. Per case it prints the median wall time of each setting and ``on / off - 1``
against the goal (at most +10% in the quick profile), and the phases' own figures from the last
``on`` run.

A benchmark, not a test: it exits 0 whether the goal is met or not (non-zero only when a run
fails).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.10


def run(phases: str, args: argparse.Namespace, out: Path) -> dict[str, dict[str, Any]]:
    """One pytest session; each case's results entry by name."""
    results = out / f"{phases}-{time.time_ns()}.json"
    command = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:cacheprovider",
               "-k", args.k, "--dlperf-protocol", args.protocol, "--dlperf-launches",
               str(args.launches), "--dlperf-phases", phases, "--dlperf-json", str(results),
               "--dlperf-baselines", str(out / "baselines"), "--dlperf-busy-threshold", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if not results.exists():
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise SystemExit(f"the {phases} run wrote no results (exit {done.returncode})")
    return {b["name"]: b["extra_info"] for b in json.loads(results.read_text())["benchmarks"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--protocol", default="quick")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("-k", default="resnet50 and torch and fp32 and eager and "
                                      "(1n1d or 1n2d)")
    args = parser.parse_args()
    walls: dict[str, dict[str, list[float]]] = {}
    last: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            order = ("on", "off") if index % 2 == 0 else ("off", "on")
            for phases in order:
                for name, info in run(phases, args, Path(tmp)).items():
                    walls.setdefault(name, {}).setdefault(phases, []).append(info["wall_s"])
                    if phases == "on":
                        last[name] = info
                print(f"round {index + 1}/{args.rounds} phases {phases}: done", flush=True)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.protocol} profile, "
          f"{args.launches} launches a case, {args.rounds} rounds a setting")
    print(f"{'case':45} {'on (s)':>8} {'off (s)':>8} {'on/off':>8}  goal <= +{GOAL:.0%}")
    for name, sides in walls.items():
        on, off = statistics.median(sides["on"]), statistics.median(sides["off"])
        print(f"{name:45} {on:8.1f} {off:8.1f} {on / off - 1:+8.1%}")
    for name, info in last.items():
        found = info.get("phases") or {}
        seconds = found.get("seconds_per_step") or {}
        step = info["wall_s"]
        print(f"\n{name}: diagnostic steps {found.get('diagnostic_steps')}, a step "
              f"{found.get('diagnostic_step_s') or 0:.3f} s (windows: "
              f"{info['global_batch'] / info['samples_per_s']:.3f} s/step); case wall {step:.1f} s")
        print("  " + ", ".join(f"{k} {v:.4f}" for k, v in seconds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
