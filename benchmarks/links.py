"""What the network between nodes shows: torch ResNet-50 and BERT-base, fp32, on 2 local nodes x 1
device, each node a network host of its own, at several link rates.

Usage (root: the nodes are network namespaces)::

    .venv/bin/python benchmarks/links.py [--links unshaped,10gbit,1gbit,100mbit]
        [--models resnet50,bert] [--warmup 2] [--steps 3] [--repeats 3]

For each link, one pytest session runs ``perf_tests`` at ``-m multinode --nodes 2
--devices-per-node 1 --dlperf-link LINK`` (the CPU profile: ResNet-50 at 64x64 images, BERT-base at
sequence length 128, their CPU batches). It prints, per model and link: the 2n1d throughput, the
speedup over 1n1d and the scaling efficiency; the bytes each rank all-reduces per step (the
model's parameters x 4 bytes, fp32 gradients); what the link measured (one TCP stream, node 0 to
node 1); and the throughput the link rate allows if computing took no time: the global batch
over the all-reduce's time at the rate asked (measured, unshaped), where a ring all-reduce over 2
nodes sends and receives (2 - 1) / 2 x 2 = 1 x the gradient bytes per node. Then the scaling
model's figures of each 2n1d case (docs/phases.md, the results' ``scaling_model`` and
``phases``): the efficiency it predicts from the 1n1d phases, the link and the measured overlap,
measured over predicted, the overlap, and the exposed communication measured against the
model's. Prints a table; exits non-zero only if a session fails.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODELS = {"resnet50": "resnet50", "bert": "bert"}


def session(link: str, models: list[str], args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """One pytest session at ``link``: the 1n1d and 2n1d fp32 cases of each model."""
    model_k = " or ".join(MODELS[m] for m in models)
    cmd = [sys.executable, "-m", "pytest", str(REPO / "perf_tests"), "-q", "-p", "no:cacheprovider",
           "-m", "multinode", "--nodes", "2", "--devices-per-node", "1", "--dlperf-device", "cpu",
           "-k", f"torch and ({model_k}) and fp32", "--dlperf-link", link,
           "--dlperf-warmup-steps", str(args.warmup), "--dlperf-steps", str(args.steps),
           "--dlperf-repeats", str(args.repeats), "--dlperf-launches", "1",
           "--dlperf-max-repeats", str(args.repeats), "--dlperf-unstable-cv", "1000%",
           "--dlperf-baselines", str(out / "baselines"), "--dlperf-json", str(out / f"{link}.json")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):  # 1: a case failed its verdict (there is no baseline)
        raise RuntimeError(f"{link}: pytest exited {done.returncode}:\n{done.stdout[-4000:]}"
                           f"{done.stderr[-2000:]}")
    print(f"{link}: session took {time.monotonic() - started:.0f} s", flush=True)
    return [b["extra_info"] for b in json.loads((out / f"{link}.json").read_text())["benchmarks"]]


def row(link: str, cases: list[dict[str, Any]], model: str) -> str | None:
    by_topology = {c["topology"]["id"]: c for c in cases if c["model"].startswith(model[:4])}
    two = by_topology.get("2n1d")
    if two is None:
        return None
    params = two["environment"]["parameters"]
    grad_bytes = 4 * params
    network = two.get("network") or {}
    measured = network.get("measured_bps")
    rate = measured if link == "unshaped" else _rate(link)
    predicted = 2 * two["batch_size"] / (grad_bytes * 8 / rate) if rate else None
    eff = two.get("scaling_efficiency")
    model_fig = two.get("scaling_model") or {}
    phases = two.get("phases") or {}
    exposed = (phases.get("seconds_per_step") or {}).get("exposed communication")
    return (f"{model:<9} {link:>9} {two['samples_per_s']:>10.2f} {two['unit']:<9}"
            f" {two['speedup'] or 0:>7.2f} {100 * (eff or 0):>5.0f}% {grad_bytes / 2**20:>9.1f}"
            f" {(measured or 0) / 1e9:>9.2f} {predicted or 0:>10.2f}"
            f" {100 * model_fig.get('predicted_efficiency', 0):>6.0f}%"
            f" {model_fig.get('measured_over_predicted') or 0:>9.2f}"
            f" {100 * (phases.get('overlap') or 0):>7.0f}%"
            f" {exposed or 0:>8.3f} {model_fig.get('exposed_s', 0):>8.3f}")


def _rate(link: str) -> float | None:
    sys.path.insert(0, str(REPO))
    from pytest_dlperf.core.link import Link

    return Link.parse(link).rate_bps


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", default="unshaped,10gbit,1gbit,100mbit")
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    links, models = args.links.split(","), args.models.split(",")
    results = {}
    with tempfile.TemporaryDirectory(prefix="dlperf-links-") as tmp:
        for link in links:
            try:
                results[link] = session(link, models, args, Path(tmp))
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
    print()
    print(f"date: {datetime.date.today()}  host: {platform.node()}  cores: {os.cpu_count()}")
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"protocol: {args.warmup} warm-up, {args.steps} timed steps x {args.repeats} repeats, "
          "1 launch; CPU profile; 2 local nodes x 1 rank, each node a network namespace")
    print(f"{'model':<9} {'link':>9} {'2n1d':>10} {'unit':<9} {'speedup':>7} {'eff.':>6}"
          f" {'MiB/step':>9} {'meas.Gb/s':>9} {'link bound':>10} {'model':>7}"
          f" {'meas/pred':>9} {'overlap':>8} {'exposed':>8} {'model':>8}")
    for model in models:
        for link in links:
            line = row(link, results[link], model)
            if line:
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
