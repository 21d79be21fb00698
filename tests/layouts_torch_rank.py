"""One rank of tests/test_layouts_torch.py's job: the real ``TorchTrainer`` trains a tiny GPT in
float64 under each layout it is given, three AdamW steps, and writes the full parameters it ends
at; rank 0 also writes what one process reaches on the same global batch.

Run by torchrun (``python -m torch.distributed.run --nproc-per-node 4 tests/layouts_torch_rank.py
OUT RUNS_JSON``). The job's four processes form a fresh world for each run (rank 0 of it hosts
the store on the run's port, as torch's env:// rendezvous does): a run of two ranks takes
processes 0-1 or 2-3, so that two such runs go at once and the job starts its interpreters once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, HIDDEN, HEADS, LAYERS, SEQUENCE, BATCH = 64, 32, 4, 4, 8, 4
SEED = 7
LR = 1e-2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(HIDDEN)
        self.q = nn.Linear(HIDDEN, HIDDEN)
        self.k = nn.Linear(HIDDEN, HIDDEN)
        self.v = nn.Linear(HIDDEN, HIDDEN)
        self.o = nn.Linear(HIDDEN, HIDDEN)
        self.norm2 = nn.LayerNorm(HIDDEN)
        self.w1 = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.w2 = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        head_dim = HIDDEN // HEADS
        h = self.norm1(x)
        # view(b, t, -1, head_dim): a tensor-parallel rank holds a share of the heads
        q, k, v = (proj(h).view(b, t, -1, head_dim).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, -1))
        return x + self.w2(F.gelu(self.w1(self.norm2(x))))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def tp_plan() -> dict[str, Any]:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(LAYERS):
        plan.update({f"blocks.{i}.{name}": ColwiseParallel() for name in ("q", "k", "v", "w1")})
        plan.update({f"blocks.{i}.{name}": RowwiseParallel() for name in ("o", "w2")})
    return plan


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1))
    return tokens[:, :-1], tokens[:, 1:]


def recipe(ctx: Any) -> Any:
    from pytest_dlperf.core.workload import Parts

    # float64: "the same" is exact but for reduction order; AMP's cases are float32 models.
    torch.set_default_dtype(torch.float32 if ctx.precision == "amp" else torch.float64)
    model = TinyGPT()
    if ctx.sizes.get("wrong_split"):
        torch.manual_seed(ctx.seed)  # every replica takes replica 0's batch: a wrong split
    inputs, targets = batch()
    split = ctx.sizes.get("split", "blocks.2")
    return Parts(model=model, inputs=inputs, targets=targets, plans={"tp": tp_plan(),
                        "pp": split.split(",") if split else None})


def spec_for(layout: Any, clip: float | None = None, sgd: bool = False,
             compiled: bool = False, amp: bool | str = False, **sizes: Any) -> Any:
    from pytest_dlperf.core.protocol import Protocol
    from pytest_dlperf.core.spec import RankSpec

    return RankSpec(framework="torch", model="tinygpt", protocol=Protocol(0, 3, 1),
                    batch_size=BATCH, optimizer=optimizer(clip, sgd), sizes=sizes, seed=SEED,
                    compiler="compiled" if compiled else "eager",
                    precision=precision(amp),
                    layout=None if layout is None else layout.to_json())


def precision(amp: bool | str) -> Any:
    """fp32; bf16 autocast (``True``, the CPU's AMP); ``"float16"``: CUDA's AMP, fp16 autocast
    with a loss scale (torch runs both on the CPU too)."""
    from pytest_dlperf.core.spec import PrecisionSpec

    if amp == "float16":
        return PrecisionSpec("amp", "float16", loss_scaling=True)
    return PrecisionSpec("amp", "bfloat16") if amp else PrecisionSpec()


def optimizer(clip: float | None, sgd: bool = False) -> Any:
    """AdamW, or SGD with momentum where a clipped norm must show: AdamW's update hardly moves
    when every gradient is scaled alike (a wrong norm, clipped, would pass unseen)."""
    from pytest_dlperf.core.spec import OptimizerSpec

    if sgd:
        return OptimizerSpec(lr=0.1, momentum=0.9, clip_norm=clip)
    return OptimizerSpec(lr=LR, kind="adamw", weight_decay=0.01, clip_norm=clip)


def full_parameters(trainer: Any) -> dict[str, torch.Tensor]:
    """Every parameter of the trained model, whole, by its name in the original model (stages
    of a pipeline gathered by the all_gather_object below)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for module in trainer.model_parts:
        for name, param in module.named_parameters():
            value = param.full_tensor() if isinstance(param, DTensor) else param
            out[name.replace("_orig_mod.", "")] = value.detach().clone()
    return out


def train(layout_text: str | None, world: int, options: dict[str, Any]) -> dict[str, Any]:
    from pytest_dlperf.core.parallel import parse_layout
    from pytest_dlperf.frameworks import DistEnv
    from pytest_dlperf.frameworks.torch import build_trainer

    layout = parse_layout(layout_text).resolve(world) if layout_text else None
    options = dict(options)
    inf_rank = options.pop("inf_rank", None)  # this rank's first gradient: an fp16 overflow
    trainer = build_trainer(spec_for(layout, **options), DistEnv.from_environ(dict(os.environ)),
                            recipe)
    try:
        if inf_rank == int(os.environ["RANK"]):
            overflow_once(trainer)
        trainer.step()
        began = time.perf_counter()
        for _ in range(2):
            trainer.step()
        step_ms = (time.perf_counter() - began) / 2 * 1000
        mine = (trainer.loss(), full_parameters(trainer), float(trainer.scaler.get_scale())
                if trainer.scaler.is_enabled() else None)
        gathered: list[Any] = [None] * world
        if world > 1:
            torch.distributed.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        # The straggler check's own step: DDP's only (the worker skips it where None).
        env = {**trainer.environment(), "local_step": trainer.local_step is not None}
    finally:
        trainer.close()
    merged: dict[str, torch.Tensor] = {}
    for _, part, _ in gathered:
        merged.update(part)
    return {"params": merged, "losses": [loss for loss, _, _ in gathered], "environment": env,
            "step_ms": step_ms, "scales": [scale for _, _, scale in gathered]}


def overflow_once(trainer: Any) -> None:
    """The first backward makes this rank's first gradient inf (its shard alone, under a
    sharded layout): the loss scaler must skip that step on every rank."""
    param = next(p for module in trainer.model_parts for p in module.parameters())
    fired: list[bool] = []

    def overflow(grad: torch.Tensor) -> torch.Tensor | None:
        if fired:
            return None
        fired.append(True)
        return grad * float("inf")

    param.register_hook(overflow)


def reference(replicas: int, clip: float | None, sgd: bool) -> dict[str, Any]:
    """One process on the global batch of ``replicas`` replicas: replica r's batch is what the
    recipe makes under seed + r, the weights are those made under the seed itself."""
    from pytest_dlperf.frameworks.torch import make_optimizer

    torch.manual_seed(SEED)
    torch.set_default_dtype(torch.float64)
    model = TinyGPT()
    inputs, targets = [], []
    for r in range(replicas):
        torch.manual_seed(SEED + r)
        TinyGPT()
        x, y = batch()
        inputs.append(x)
        targets.append(y)
    x, y = torch.cat(inputs), torch.cat(targets)
    adamw = make_optimizer(torch, list(model.parameters()), optimizer(clip, sgd), fused=False)
    for _ in range(3):
        adamw.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        adamw.step()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "loss": float(loss), "losses": [
                float(F.cross_entropy(logits[r * BATCH:(r + 1) * BATCH].flatten(0, 1),
                                      y[r * BATCH:(r + 1) * BATCH].flatten()))
                for r in range(replicas)]}


def reference_name(run: dict[str, Any]) -> str:
    """The file of the one-process run a layout's run is compared with."""
    options = run.get("options", {})
    return f"reference-{run['replicas']}-{options.get('clip')}-{options.get('sgd', False)}"


def run_each(out: Path, runs: list[dict[str, Any]],
             train: Callable[[str | None, int, dict[str, Any]], dict[str, Any]]) -> int:
    """Each run this job rank takes part in, in a fresh world of its own: ``train(layout,
    world, options)``, whose result the run's first rank saves as ``<name>.pt``. A run:
    {"name", "layout", "world", "port", "first": the job rank it starts at, "options"}.
    Returns this process's job rank."""
    job_rank = int(os.environ["RANK"])
    base = dict(os.environ)
    for run in runs:
        first, world = run["first"], run["world"]
        if not first <= job_rank < first + world:
            continue
        os.environ.update(RANK=str(job_rank - first), WORLD_SIZE=str(world),
                          LOCAL_RANK=str(job_rank - first), LOCAL_WORLD_SIZE=str(world),
                          MASTER_PORT=str(run["port"]), TORCHELASTIC_USE_AGENT_STORE="False")
        result = train(run["layout"], world, run.get("options", {}))
        if job_rank == first:
            torch.save(result, out / f"{run['name']}.pt")
        os.environ.clear()
        os.environ.update(base)
    return job_rank


def end() -> NoReturn:
    """The job's last act once its results are saved: out without the interpreter's teardown.
    A process group of an earlier run can still be finishing its last collective's work on a
    gloo thread (a rank that ran several worlds keeps their groups' threads); at teardown that
    thread's release of a tensor needs the GIL, Python ends the thread, and the unwind through
    a C++ destructor aborts the process ("terminate called without an active exception",
    SIGABRT after every result was written: 3 torchrun jobs of Wide & Deep's nine runs in ~60
    here, 2026-12-07, the core's stack in ``ProcessGroupGloo::runLoop``). The plugin's own
    launchers never wait for that teardown (once every rank's result is in, the ranks are
    ended)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    out, runs = Path(sys.argv[1]), json.loads(sys.argv[2])
    # runs also carry "replicas": the one-process reference each is compared with
    if run_each(out, runs, train) == 0:
        for name in {reference_name(run) for run in runs}:
            _, replicas, clip, sgd = name.split("-")
            torch.save(reference(int(replicas), None if clip == "None" else float(clip),
                                 sgd == "True"), out / f"{name}.pt")
    end()


if __name__ == "__main__":
    main()
