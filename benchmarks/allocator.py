"""What the heap allocator does to a rank's training step on a CPU, and whether what a launch
does before its first timed step changes it: the evidence behind ``--dlperf-allocator``
(``core.allocator``) and behind counting FLOPs after the windows.

Usage::

    .venv/bin/python benchmarks/allocator.py [--models mlp,gpt,bert_base,resnet50]
        [--frameworks torch] [--threads 1,2] [--allocators glibc-dynamic,glibc,jemalloc,tcmalloc]
        [--first none,count] [--rounds 3] [--steps 100] [--windows 2] [--warmup 20]
        [--python oneflow=PATH,...]

Method. Every cell is one fresh rank process, started as the local launcher starts a 1n1d rank
(its environment: ``launch.processes.worker_environment`` and ``one_node_environment``, the
allocator set by ``core.allocator``; under the framework's interpreter), that runs the plugin's
own rank (``rank.worker.run``: the framework's trainer, the windows timed and waited on as in a
case) on the model's CPU sizes. ``--first count`` counts the model's FLOPs on torch's meta
device first (``rank.flops.count_in_rank``), as launch 1 of a case did before the count moved
after the windows; ``none`` does not. Cells take turns round after round (the order shuffled
with a fixed seed), so this VM's drift over minutes reaches every cell alike. Each cell prints
the median window's samples/s over the rounds, the range, the minor page faults per step (the
rank's process, every thread; the heap fetching fresh pages from the kernel) and the peak RSS.
The models: ``mlp`` is the issue's (512 -> 1024 -> 512 -> 10, batch 128, SGD), the others the
built-in workloads at their CPU sizes.

A benchmark, not a test: it prints what it measures and exits 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BATCH = 128


def mlp(ctx: Any) -> Any:
    """The issue's MLP of one's own: 512 -> 1024 -> 512 -> 10, GELU, batch 128."""
    import torch

    from pytest_dlperf import Parts

    torch.manual_seed(ctx.seed)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 10))
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, 512),
                 targets=torch.randint(0, 10, (ctx.batch_size,)))


def spec_json(model: str, framework: str, args: argparse.Namespace, threads: int) -> str:
    from pytest_dlperf import Workload
    from pytest_dlperf.core.protocol import Protocol
    from pytest_dlperf.core.recipes import RecipeReference
    from pytest_dlperf.core.spec import spec_for
    from pytest_dlperf.models import builtin

    protocol = Protocol(args.warmup, args.steps, args.windows, name="allocator-bench")
    if model == "mlp":
        workload = Workload(name="mlp", recipes={"torch": "allocator:mlp"},
                            batch_size={"cpu": BATCH})
        recipe = RecipeReference("allocator", "mlp", str(ROOT / "benchmarks"))
        spec = spec_for(framework, workload, protocol=protocol, device_type="cpu",
                        recipe=recipe)
    else:
        from pytest_dlperf.plugin.adapters import Adapter

        adapter = Adapter.resolve(framework)
        workload = builtin(model, framework, adapter.recipe_key)
        spec = spec_for(framework, workload, protocol=protocol, device_type="cpu",
                        recipe=adapter.recipe_for(workload))
    return spec.with_(threads=threads, phase_steps=0).dumps()


def child(spec_path: str, first: str) -> int:
    """One cell, inside its rank process."""
    from pytest_dlperf.core.spec import RankSpec
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.rank import worker

    spec = RankSpec.from_json(json.loads(Path(spec_path).read_text()))
    if first == "count":
        from pytest_dlperf.rank.flops import count_in_rank

        count_in_rank(spec)
    result = worker.run(spec, DistEnv.from_environ(dict(os.environ)))
    windows = result["windows"]
    memory = result["memory"]["windows"]
    rates = [spec.batch_size * spec.units_per_sample * w["steps"] / w["elapsed_s"]
             for w in windows]
    print(json.dumps({"rates": rates,
                      "faults": [m["minor_faults"] / w["steps"] for m, w in zip(memory, windows)],
                      "rss": max(m["host_rss_bytes"] for m in memory),
                      "malloc": result["environment"]["allocator_in_effect"]["malloc"]}))
    return 0


def cell(model: str, framework: str, threads: int, allocator: str, first: str,
         args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from pytest_dlperf.core import allocator as heap
    from pytest_dlperf.core.ports import free_loopback_port
    from pytest_dlperf.core.topology import Topology
    from pytest_dlperf.launch.processes import (
        one_node_environment,
        rank_variables,
        worker_environment,
    )

    chosen = heap.parse(allocator)
    spec = json.loads(spec_json(model, framework, args, threads))
    spec["allocator"] = chosen.to_json()
    path = folder / f"{model}-{framework}-{threads}-{time.time_ns()}.json"
    path.write_text(json.dumps(spec))
    topology = Topology(1, 1, "cpu", "cpu", threads)
    python = args.python.get(framework)
    env = one_node_environment(worker_environment(
        topology, folder, python, free_loopback_port(), False, allocator=chosen.to_json()),
        topology)
    env.update(rank_variables(0))
    done = subprocess.run([python or sys.executable, __file__, "--child", str(path), first],
                          env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{model} {framework} {allocator} {first}: the rank failed:\n"
                         f"{done.stderr[-3000:]}")
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def figure(value: float) -> str:
    """Three significant figures, thousands separated."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--models", default="mlp,gpt,bert_base,resnet50")
    parser.add_argument("--frameworks", default="torch")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--allocators", default="glibc-dynamic,glibc,jemalloc,tcmalloc")
    parser.add_argument("--first", default="none,count")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--python", default="",
                        help="FRAMEWORK=PATH,...: a framework's rank interpreter")
    parser.add_argument("--seed", type=int, default=51)
    parser.add_argument("--pool-out", type=Path, help="write every cell's figures here (JSON)")
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    args.python = dict(p.split("=", 1) for p in args.python.split(",") if p)
    allocators = args.allocators.split(";") if ";" in args.allocators else \
        args.allocators.split(",")
    cells = [c for c in itertools.product(args.models.split(","), args.frameworks.split(","),
                                          [int(t) for t in args.threads.split(",")],
                                          allocators, args.first.split(","))
             if c[4] == "none" or c[1] == "torch"]
    rng = random.Random(args.seed)
    seen: dict[tuple[Any, ...], list[dict[str, Any]]] = {c: [] for c in cells}
    started = time.time()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {len(cells)} cells x "
          f"{args.rounds} rounds, {args.warmup} warm-up + {args.windows} x {args.steps} steps "
          "a cell", flush=True)
    with tempfile.TemporaryDirectory(prefix="allocator-") as tmp:
        for number in range(args.rounds):
            order = list(cells)
            rng.shuffle(order)
            for one in order:
                seen[one].append(cell(*one, args, Path(tmp)))
            print(f"  round {number + 1}/{args.rounds}: {time.time() - started:.0f} s",
                  flush=True)
    if args.pool_out:
        args.pool_out.write_text(json.dumps([[list(c), runs] for c, runs in seen.items()]))
    print("\n| model | framework | threads | before the windows | allocator | samples/s "
          "(median, range) | page faults / step | peak RSS | malloc |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (model, framework, threads, allocator, first), runs in seen.items():
        medians = [statistics.median(r["rates"]) for r in runs]
        faults = statistics.median(f for r in runs for f in r["faults"])
        print(f"| {model} | {framework} | {threads} | {'FLOP count' if first == 'count' else '-'}"
              f" | {allocator} | {figure(statistics.median(medians))} ({figure(min(medians))}-"
              f"{figure(max(medians))}) | {faults:,.0f} | "
              f"{max(r['rss'] for r in runs) / 2**20:,.0f} MiB | "
              f"{Path(runs[0]['malloc'] or '?').name} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
