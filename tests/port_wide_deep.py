"""The port job's Wide & Deep ports (tests/port_job.py): built as a CPU case builds it (vocab
200k: its parameters by torch's names and shapes, as many trainable), then SMALL from torch's
weights (tests/port_references.py's reference), each under its framework's interpreter: no
pytest, the framework imported inside its function only.

Each framework runs in a process of its own: TensorFlow's and Paddle's Wide & Deep in one
process crash it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# float32 on both sides, measured 3.7e-8 (TensorFlow) and 6.0e-8 (Paddle) apart (logits up
# to 0.22; the loss, 0.69, 6.0e-8). A tower without its ReLUs moves the logits by 3.0e-1,
# the wide logit left out by 8.8e-2.


def sizes(small: bool) -> dict[str, Any]:
    """A CPU case's sizes; SMALL's (small enough to build in a moment, with every part of
    the model: 2 hidden layers) where ``small``."""
    from pytest_dlperf.models import wide_deep

    cpu = wide_deep.WORKLOAD.sizes_for("cpu", "fp32")  # vocab 200k, as a CPU case builds it
    return {**cpu, "vocab": 5_000, "hidden_size": 64} if small else cpu


def wide_deep_tensorflow(spec: dict[str, Any]) -> dict[str, Any]:
    """Built from the recipe at a CPU case's sizes; then SMALL from torch's weights, in
    inference (no dropout on either side), on torch's batch of 64."""
    from pytest_dlperf.core.workload import BuildContext
    from pytest_dlperf.models.wide_deep import WideDeepShape
    from pytest_dlperf.models.wide_deep import tensorflow as ours

    context = BuildContext("tensorflow", "cpu", "cpu", 8, sizes(False), "fp32", "float32",
                           False, 0, 0, 1, 0)
    model = ours.recipe(context).model
    out: dict[str, Any] = {"shapes": ours.torch_named_shapes(model), "probes": {
        "trainable": sum(int(np.prod(w.shape)) for w in model.trainable_weights)}}
    del model
    ref = np.load(spec["reference"])
    model = ours.build(WideDeepShape.of(sizes(True)))
    ours.load_torch_weights(model, {k.removeprefix("param/"): ref[k] for k in ref.files
                                    if k.startswith("param/")})
    logits = model((ref["dense"], ref["wide"], ref["deep"]), training=False)
    loss = ours.click_loss(logits, ref["clicks"])
    out["outputs"] = {"eager": {"logits": float(np.abs(logits.numpy() - ref["logits"]).max()),
                                "loss": float(abs(float(loss) - float(ref["loss"])))}}
    out["once"] = {}
    return out


def wide_deep_paddle(spec: dict[str, Any]) -> dict[str, Any]:
    """Built from the recipe at a CPU case's sizes; then SMALL from torch's weights, in eval
    mode (no dropout on either side), on torch's batch of 64."""
    import math

    import paddle

    from pytest_dlperf.core.workload import BuildContext
    from pytest_dlperf.models.wide_deep import WideDeepShape
    from pytest_dlperf.models.wide_deep import paddle as ours

    context = BuildContext("paddle", "cpu", "cpu", 8, sizes(False), "fp32", "float32", False,
                           0, 0, 1, 0)
    model = ours.recipe(context).model
    out: dict[str, Any] = {"shapes": ours.torch_named_shapes(model), "probes": {
        "trainable": sum(math.prod(p.shape) for p in model.parameters()
                         if not p.stop_gradient)}}
    del model
    ref = np.load(spec["reference"])
    model = ours.build(WideDeepShape.of(sizes(True)))
    model.eval()
    ours.load_torch_weights(model, {k.removeprefix("param/"): ref[k] for k in ref.files
                                    if k.startswith("param/")})
    with paddle.no_grad():
        logits = model(*(paddle.to_tensor(ref[k]) for k in ("dense", "wide", "deep")))
        loss = ours.click_loss(logits, paddle.to_tensor(ref["clicks"]))
    out["outputs"] = {"eager": {"logits": float(np.abs(logits.numpy() - ref["logits"]).max()),
                                "loss": float(abs(float(loss) - float(ref["loss"])))}}
    out["once"] = {}
    return out


def wide_deep_oneflow(spec: dict[str, Any]) -> dict[str, Any]:
    """Built at a CPU case's sizes: its parameters by name and shape, initialized as torch's
    (tables uniform in (-0.05, 0.05), the tower Xavier-uniform, zero biases); its ids from
    torch's uniforms. Then SMALL from torch's weights, in eval mode (no dropout on either
    side), on torch's batch of 64."""
    import oneflow as flow

    from pytest_dlperf.models.wide_deep import WideDeepShape
    from pytest_dlperf.models.wide_deep.oneflow import build, ids_of

    model = build(WideDeepShape.of(sizes(False)))
    fresh = {n: p.numpy().copy() for n, p in model.named_parameters()}
    tables = np.concatenate([fresh["wide_embedding.weight"].ravel(),
                             fresh["deep_embedding.weight"].ravel()])
    first = fresh["tower.0.weight"]
    ref = np.load(spec["reference"])
    shape = WideDeepShape.of(sizes(True))
    ids = {name: ids_of(shape, flow.tensor(ref["u/" + name]), first_slot).numpy()
           for name, first_slot in (("wide", shape.deep_slots), ("deep", 0))}
    out: dict[str, Any] = {"shapes": {n: list(a.shape) for n, a in fresh.items()}, "probes": {
        "ids_differ": {k: int((ids[k] != ref[k]).sum()) for k in ids},
        "table_range": [float(tables.min()), float(tables.max())],
        "table_std": float(tables.std()),
        "first_bound": float(np.abs(first).max()) / float(np.sqrt(6 / sum(first.shape))),
        "biases": max(float(np.abs(v).max()) for n, v in fresh.items() if n.endswith("bias"))}}
    del model, fresh, tables
    model = build(shape).eval()
    model.load_state_dict({n: flow.tensor(ref["param/" + n]) for n, _ in model.named_parameters()})
    with flow.no_grad():
        logits = model(*(flow.tensor(ref[k]) for k in ("dense", "wide", "deep")))
        loss = flow.nn.functional.binary_cross_entropy_with_logits(logits,
                                                                   flow.tensor(ref["clicks"]))
    out["outputs"] = {"eager": {"logits": float(np.abs(logits.numpy() - ref["logits"]).max()),
                                "loss": float(abs(loss.numpy() - ref["loss"]))}}
    out["once"] = {}
    return out


# -- two ranks train what one process trains (tests/port_ranks.py, tests/test_ports_ranks.py) --

# torch: the tables sharded by TorchRec's sharders (the ``emb`` kind). One torchrun job of two
# processes (tests/wide_deep_torch_rank.py) trains each run with the real ``TorchTrainer``, three
# AdamW steps in float32 (TorchRec's tables have no float64); one process trains the unsharded
# model on the run's global batch. name: (layout, world, options)
TORCH_RUNS: dict[str, tuple[str | None, int, dict[str, Any]]] = {
    "ddp2": (None, 2, {}),
    "emb1-tw": ("emb-tw", 1, {}),
    "emb2-dp": ("emb-dp", 2, {}),
    "emb2-tw": ("emb-tw", 2, {}),
    "emb2-cw": ("emb-cw", 2, {}),
    "emb2-twcw": ("emb-twcw", 2, {}),
    "emb2-rw": ("emb-rw", 2, {}),
    # lazy Adam on the tables' sparse gradients, against one process running it
    "emb1-sparse": ("emb-sparse", 1, {}),
    "emb2-sparse": ("emb-sparse", 2, {}),
    # both ranks train on rank 0's batch: the same code and weights, another global batch
    "emb2-rw-wrong-split": ("emb-rw", 2, {"wrong_split": 1}),
}


def torch_reference(run: dict[str, Any]) -> str:
    from wide_deep_torch_rank import reference_name

    return reference_name(run["world"], "sparse" in str(run["layout"]))


def torch_run(name: str, run: Any) -> None:
    """Every rank trains on a batch of its own, under the layout it was given."""
    layout, world, _ = TORCH_RUNS[name]
    env = run.ranks[0]["environment"]
    assert env["data_parallel_ranks"] == world
    if layout is not None:
        assert env["layout"] == name.split("-", 1)[0] + "-" + layout.split("-")[1]


def shards(run: Any) -> dict[str, list[list[int]]]:
    return run.ranks[0]["environment"]["sharded_modules"]["emb"]["tables"]


def torch_each_rank_holds_the_shards_of_its_plan(runs: Any) -> None:
    from wide_deep_torch_rank import SIZES

    vocab, width = SIZES["vocab"], SIZES["deep_width"]
    # [rank, first row, first column, rows, columns]; the biggest table placed first
    assert shards(runs["emb2-tw"]) == {"tables.deep": [[0, 0, 0, vocab, width]],
                                       "tables.wide": [[1, 0, 0, vocab, 1]]}
    assert shards(runs["emb2-cw"]) == {
        "tables.deep": [[0, 0, 0, vocab, width // 2], [1, 0, width // 2, vocab, width // 2]],
        "tables.wide": [[0, 0, 0, vocab, 1]]}  # one column: whole, on the least loaded rank
    assert shards(runs["emb2-twcw"]) == shards(runs["emb2-cw"])
    assert shards(runs["emb2-rw"]) == {
        name: [[0, 0, 0, vocab // 2, columns], [1, vocab // 2, 0, vocab // 2, columns]]
        for name, columns in (("tables.deep", width), ("tables.wide", 1))}
    assert shards(runs["emb2-dp"]) == {"tables.deep": [[-1, 0, 0, -1, -1]],
                                       "tables.wide": [[-1, 0, 0, -1, -1]]}
    # emb-sparse: torch's own tables, whole on every rank
    assert shards(runs["emb2-sparse"]) == {"deep_embedding": [[-1, 0, 0, -1, -1]],
                                           "wide_embedding": [[-1, 0, 0, -1, -1]]}


def torch_a_plan_that_spreads_the_tables_leaves_less_on_each_rank(runs: Any) -> None:
    from wide_deep_torch_rank import SIZES

    table_bytes = SIZES["vocab"] * (SIZES["deep_width"] + 1) * 4
    whole = runs["ddp2"].ranks[0]["bytes_per_rank"]
    assert runs["emb2-dp"].ranks[0]["bytes_per_rank"] == whole
    tower = whole[0] - table_bytes
    rw = runs["emb2-rw"].ranks[0]["bytes_per_rank"]
    assert rw == [tower + table_bytes // 2] * 2, (rw, whole)
    for name in ("emb2-tw", "emb2-cw"):
        held = runs[name].ranks[0]["bytes_per_rank"]
        assert max(held) < whole[0] and sum(held) == 2 * tower + table_bytes, (name, held)


# OneFlow: the tables split by rows over two ranks (``emb-rw``, OneFlow-Benchmark's way: global
# tensors, SBP). One job of two ranks (tests/wide_deep_oneflow_rank.py, OneFlow's own launcher)
# trains every run, three Adam steps in float32; measured 2026-11-29: DDP, emb2-rw and emb2-dp
# all within 9.9e-7 of how far the parameters moved (0.030), a wrong data split 1.9.
# name: (layout, compiler, options)
ONEFLOW_RUNS: dict[str, tuple[str | None, str, dict[str, Any]]] = {
    "ddp2": (None, "eager", {}),
    "emb2-rw": ("emb-rw", "eager", {}),
    "emb2-dp": ("emb-dp", "eager", {}),
    "emb2-rw-wrong-split": ("emb-rw", "eager", {"wrong_split": 1}),
    "emb2-tw": ("emb-tw", "eager", {}),
    "emb2-rw-graph": ("emb-rw", "compiled", {}),
}
VOCAB, WIDTH = 1000, 8  # tests/wide_deep_oneflow_rank.py's SIZES


def oneflow_run(name: str, run: Any) -> None:
    ranks = run.ranks
    assert ranks[0]["environment"]["data_parallel_ranks"] == 2  # a batch of each rank's own
    if name.startswith("emb"):
        # The global batch's loss, the same on both ranks (not a rank's partial sum).
        assert ranks[0]["loss"] == ranks[1]["loss"]
        assert ranks[0]["environment"]["layout"] == name
        assert 0.3 < ranks[0]["loss"] < 1.5, ranks[0]["loss"]


def oneflow_each_rank_holds_half_the_rows(runs: Any) -> None:
    """emb2-rw: each rank's shard of each table is half its rows (all its columns), so its
    tables take half the bytes they take under DDP; emb2-dp keeps them whole."""
    table_shards = {"wide_embedding.weight": [VOCAB // 2, 1],
                    "deep_embedding.weight": [VOCAB // 2, WIDTH]}
    table_bytes = VOCAB * (WIDTH + 1) * 4
    for rank in (0, 1):
        rw, ddp = runs["emb2-rw"].ranks[rank], runs["ddp2"].ranks[rank]
        assert rw["local_shapes"] == table_shards, rw["local_shapes"]
        assert ddp["held"] - rw["held"] == table_bytes // 2, (ddp["held"], rw["held"])
        assert runs["emb2-dp"].ranks[rank]["held"] == ddp["held"]
    assert runs["emb2-rw"].ranks[0]["environment"]["sharded_modules"]["emb"] == {
        "plan": "rw", "tables": {
            name: [[0, 0, 0, VOCAB // 2, columns], [1, VOCAB // 2, 0, VOCAB // 2, columns]]
            for name, columns in (("wide_embedding", 1), ("deep_embedding", WIDTH))}}
    assert runs["emb2-dp"].ranks[0]["environment"]["sharded_modules"]["emb"]["tables"] == {
        "wide_embedding": [[-1, 0, 0, -1, -1]], "deep_embedding": [[-1, 0, 0, -1, -1]]}


def oneflow_refuses_what_it_does_not_run_saying_why(runs: Any) -> None:
    for rank in (0, 1):
        assert "tw: table-wise" in runs["emb2-tw"].ranks[rank]["error"]
        assert "not ported to OneFlow" in runs["emb2-tw"].ranks[rank]["error"]
        assert "separated_header_mem_ptr" in runs["emb2-rw-graph"].ranks[rank]["error"]


def ranks_jobs() -> dict[str, Any]:
    """This model's ranks jobs by port id (tests/port_ranks.py's ``RanksJob``)."""
    from port_ranks import RanksJob, oneflow_job, torchrun_job

    return {
        "wide_deep-torch": RanksJob(
            torchrun_job("wide_deep_torch_rank.py", TORCH_RUNS, torch_reference),
            run_check=torch_run, needs="torchrec",
            checks=(torch_each_rank_holds_the_shards_of_its_plan,
                    torch_a_plan_that_spreads_the_tables_leaves_less_on_each_rank)),
        "wide_deep-oneflow": RanksJob(
            oneflow_job("wide_deep_oneflow_rank.py", ONEFLOW_RUNS, "Wide & Deep"),
            interpreter="oneflow_python", run_check=oneflow_run, moved=0.01,
            checks=(oneflow_each_rank_holds_half_the_rows,
                    oneflow_refuses_what_it_does_not_run_saying_why)),
    }
