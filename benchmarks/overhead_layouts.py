"""Plugin overhead under a layout: the built-in GPT trained FSDP2 on 2 ranks, by hand and through
pytest-dlperf, sides alternating in one run.

Usage::

    .venv/bin/python benchmarks/overhead_layouts.py [--steps 30] [--warmup 5] [--repeats 5]
                                                    [--rounds 3] [--ranks 2] [--batch-size 4]

Method (as ``benchmarks/overhead.py``, whose docstring says why the sides alternate and the order
flips every round):

- *By hand*: ``python -m torch.distributed.run --nproc-per-node RANKS`` starts this file with
  ``--hand-worker``: a plain FSDP2 loop written here (a gloo process group, a CPU device mesh,
  ``fully_shard`` on every block and then the root, fused AdamW with torchtitan's GPT settings,
  the global gradient norm clipped to 1.0, fresh random targets every step, one thread per rank
  as the plugin gives two ranks on two cores). It imports the model's definition only
  (``pytest_dlperf.models.gpt.torch.build``: the same network on both sides), nothing of the
  harness. ``warmup`` untimed steps, then ``repeats`` windows of ``steps`` steps; a window lasts
  as long as its slowest rank took; tokens/s = sequences x ranks x tokens x steps / seconds.
- *Through the plugin*: ``pytest`` in a subprocess on a generated test that takes the ``layout``
  fixture under ``@pytest.mark.layouts("fsdp")`` and calls ``measure("torch", "gpt")``, its
  ``1n2d-fsdp2`` case only, one launch; its windows' tokens/s from ``--dlperf-json``.

Both sides train the small CPU GPT (``gpt.CPU_SIZES``: GPT-2's shape, 4 layers, hidden 128,
sequence 64) at the same per-rank batch. It prints ``plugin / hand`` (medians of every window of
each side) against the goal (>= 0.99). A benchmark, not a test: it exits 0 whatever the ratio
(non-zero only when a run fails).
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

GOAL = 0.99
HAND, PLUGIN = "hand", "plugin"
REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- by hand (ranks)

def hand_worker(args: argparse.Namespace) -> int:
    """One rank of the plain FSDP2 loop; rank 0 prints one JSON line of per-window tokens/s."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from pytest_dlperf.models.gpt import CPU_SIZES, GPTShape
    from pytest_dlperf.models.gpt.torch import build as torch_model

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = GPTShape.of(CPU_SIZES)
    torch.manual_seed(0)  # the same weights on every rank before sharding
    model = torch_model(shape, "cpu")
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() > 1]
    no_decay = [p for p in params if p.dim() <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    generator = torch.Generator().manual_seed(1 + rank)
    length, vocab = shape.seq_length, shape.vocab_size
    tokens = torch.randint(0, vocab, (args.batch_size, length), generator=generator)
    targets = torch.empty_like(tokens)

    def step() -> None:
        targets.random_(0, vocab, generator=generator)
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                 targets.flatten())
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.repeats):
        dist.barrier()
        begin = time.perf_counter()
        for _ in range(args.steps):
            step()
        elapsed = torch.tensor([time.perf_counter() - begin])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's window
        rates.append(args.batch_size * world * length * args.steps / float(elapsed))
    if rank == 0:
        print(json.dumps({"tokens_per_s": rates}), flush=True)
    dist.destroy_process_group()
    return 0


def run_hand(args: argparse.Namespace) -> list[float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
           "--master-addr", "127.0.0.1", "--master-port", str(29_400 + os.getpid() % 500),
           __file__, "--hand-worker", "--steps", str(args.steps), "--warmup",
           str(args.warmup), "--repeats", str(args.repeats), "--batch-size",
           str(args.batch_size), "--threads", str(args.threads)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the hand-written FSDP2 loop failed:\n{done.stderr[-3000:]}")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1]
    return list(json.loads(line)["tokens_per_s"])


# --------------------------------------------------------------------------- through the plugin

TEST = '''
import pytest


@pytest.mark.layouts("fsdp")
def test_gpt(cluster, layout, throughput_meter):
    throughput_meter.measure("torch", "gpt", batch_size={batch})
'''


def run_plugin(args: argparse.Namespace, folder: Path) -> list[float]:
    (folder / "test_gpt_overhead.py").write_text(TEST.format(batch=args.batch_size))
    out = folder / "results.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "no:randomly", str(folder / "test_gpt_overhead.py"), "-k", "1n2d-fsdp2",
           "--devices-per-node", str(args.ranks), "--dlperf-protocol", "quick",
           "--dlperf-warmup-steps", str(args.warmup), "--dlperf-steps", str(args.steps),
           "--dlperf-repeats", str(args.repeats), "--dlperf-launches", "1",
           "--dlperf-baselines", str(folder / "bl"), "--dlperf-json", str(out),
           "--dlperf-busy-threshold", "1", "--dlperf-unstable-cv", "100"]
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=900)
    if not out.exists():
        raise RuntimeError(f"the plugin's run failed:\n{done.stdout[-3000:]}")
    (bench,) = json.loads(out.read_text())["benchmarks"]
    info = bench["extra_info"]
    assert info["unit"] == "tokens" and info["layout"] == "fsdp2", info["layout"]
    return list(info["samples_per_s_repeats"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int,
                        default=max(1, len(os.sched_getaffinity(0)) // 2))
    parser.add_argument("--hand-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hand_worker:
        return hand_worker(args)
    windows: dict[str, list[float]] = {HAND: [], PLUGIN: []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = (HAND, PLUGIN) if round_ % 2 == 0 else (PLUGIN, HAND)
            for side in order:
                got = run_hand(args) if side == HAND else run_plugin(args, Path(tmp))
                windows[side].extend(got)
                print(f"round {round_ + 1}/{args.rounds} {side:>6}: median "
                      f"{statistics.median(got):,.0f} tokens/s over {len(got)} windows",
                      flush=True)
    hand, plugin = (statistics.median(windows[s]) for s in (HAND, PLUGIN))
    ratio = plugin / hand
    print(f"GPT (small CPU sizes), FSDP2 on {args.ranks} ranks, batch {args.batch_size} per "
          f"rank, {args.steps}-step windows x {args.repeats} x {args.rounds} rounds "
          f"({time.strftime('%Y-%m-%d')})")
    print(f"hand {hand:,.0f} tokens/s, plugin {plugin:,.0f} tokens/s: plugin / hand = "
          f"{ratio:.4f} (goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
