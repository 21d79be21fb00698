"""Wide & Deep on OneFlow: torch's model (torch's weights give torch's loss, the ids follow
torch's power law) and, with its tables split by rows over two ranks (``emb-rw``, OneFlow-Benchmark's way: global tensors,
SBP), to where one process trains on the same global batch, each rank holding half the rows.
Trained through the adapter on one process (eager and nn.Graph): the port contract's row in
tests/ports.py, run by tests/test_ports_trained.py.

They run under OneFlow's interpreter (``scripts/setup-oneflow``, or DLPERF_TEST_ONEFLOW_PYTHON)
and skip without it. One job of two ranks (tests/wide_deep_oneflow_rank.py, OneFlow's own
launcher) trains every run, three Adam steps in float32; measured 2026-11-29: DDP, emb2-rw and
emb2-dp all within 9.9e-7 of how far the parameters moved (0.030), a wrong data split 1.9.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from snippets import oneflow_launch_runs, run_snippet

# name: (layout, compiler, options)
RUNS: dict[str, tuple[str | None, str, dict[str, Any]]] = {
    "ddp2": (None, "eager", {}),
    "emb2-rw": ("emb-rw", "eager", {}),
    "emb2-dp": ("emb-dp", "eager", {}),
    "emb2-rw-wrong-split": ("emb-rw", "eager", {"wrong_split": 1}),
    "emb2-tw": ("emb-tw", "eager", {}),
    "emb2-rw-graph": ("emb-rw", "compiled", {}),
}
SAME = 1e-5  # float32, reduction orders apart: 9.9e-7 of how far the parameters moved, seen
VOCAB, WIDTH = 1000, 8  # tests/wide_deep_oneflow_rank.py's SIZES


def torch_reference(path: Path) -> None:
    """torch's model (dropout off: eval), a batch, its logits and loss, and the uniforms its
    ids were drawn from, written to ``path`` (npz)."""
    import torch

    from pytest_dlperf.models.wide_deep import CPU_SIZES, WideDeepShape
    from pytest_dlperf.models.wide_deep.torch import build, power_law_ids

    shape = WideDeepShape.of({**CPU_SIZES, "vocab": 5000, "hidden_size": 32})
    torch.manual_seed(3)
    model = build(shape).eval()
    out: dict[str, Any] = {f"param/{n}": p.detach().numpy() for n, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(5)
    batch = 64
    dense = torch.rand(batch, shape.dense_fields, generator=generator)
    for name, slots, first in (("wide", shape.wide_slots, shape.deep_slots),
                               ("deep", shape.deep_slots, 0)):
        state = generator.get_state()
        out[name] = power_law_ids(shape, batch, slots, first, generator, "cpu").numpy()
        generator.set_state(state)  # the uniforms those ids came from
        out[f"u/{name}"] = torch.rand(batch, slots, generator=generator,
                                      dtype=torch.float64).numpy()
    labels = torch.rand(batch, generator=generator).round()
    with torch.no_grad():
        logits = model(dense, torch.from_numpy(out["wide"]), torch.from_numpy(out["deep"]))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    np.savez(path, dense=dense.numpy(), labels=labels.numpy(), logits=logits.numpy(),
             loss=loss.numpy(), **out)


SAME_MODEL = """
import json
import numpy as np
import oneflow as flow
from pytest_dlperf.models.wide_deep import CPU_SIZES, WideDeepShape
from pytest_dlperf.models.wide_deep.oneflow import build, ids_of
ref = np.load(REFERENCE)
shape = WideDeepShape.of({**CPU_SIZES, "vocab": 5000, "hidden_size": 32})
model = build(shape).eval()
fresh = {n: p.numpy().copy() for n, p in model.named_parameters()}
shapes = [[n, list(p.shape)] for n, p in model.named_parameters()]
model.load_state_dict({n: flow.tensor(ref["param/" + n]) for n, _ in model.named_parameters()})
ids = {name: ids_of(shape, flow.tensor(ref["u/" + name]), first).numpy()
       for name, first in (("wide", shape.deep_slots), ("deep", 0))}
with flow.no_grad():
    logits = model(flow.tensor(ref["dense"]), flow.tensor(ref["wide"]), flow.tensor(ref["deep"]))
    loss = flow.nn.functional.binary_cross_entropy_with_logits(logits, flow.tensor(ref["labels"]))
tables = np.concatenate([fresh["wide_embedding.weight"].ravel(),
                         fresh["deep_embedding.weight"].ravel()])
first = fresh["tower.0.weight"]
print(json.dumps({
    "shapes": shapes,
    "logits": float(np.abs(logits.numpy() - ref["logits"]).max()),
    "loss": float(abs(loss.numpy() - ref["loss"])),
    "ids_differ": {k: int((ids[k] != ref[k]).sum()) for k in ids},
    "table_range": [float(tables.min()), float(tables.max())],
    "table_std": float(tables.std()),
    "first_bound": float(np.abs(first).max()) / float(np.sqrt(6 / sum(first.shape))),
    "biases": max(float(np.abs(v).max()) for n, v in fresh.items() if n.endswith("bias"))}))
"""


def test_torchs_weights_give_torchs_loss_and_ids(oneflow_python: str, tmp_path: Path) -> None:
    """The OneFlow model has torch's parameters by name and shape, in torch's order; given
    torch's weights it gives torch's logits and loss on torch's batch; its ids from torch's
    uniforms are torch's ids; and it is initialized as torch's is (tables uniform in
    (-0.05, 0.05), the tower Xavier-uniform, zero biases)."""
    pytest.importorskip("torch")
    reference = tmp_path / "ref.npz"
    torch_reference(reference)
    out = run_snippet(oneflow_python, SAME_MODEL.replace("REFERENCE", repr(str(reference))))
    assert isinstance(out, dict)
    ref = np.load(reference)
    assert out["shapes"] == [[key[6:], list(ref[key].shape)] for key in ref.files
                             if key.startswith("param/")]
    assert out["logits"] < 1e-5 and out["loss"] < 1e-6, out
    assert out["ids_differ"] == {"wide": 0, "deep": 0}, out
    low, high = out["table_range"]
    assert -0.05 <= low < -0.049 and 0.049 < high <= 0.05, out
    assert out["table_std"] == pytest.approx(0.05 / 3 ** 0.5, rel=0.02), out
    assert 0.95 < out["first_bound"] <= 1.0, out  # Xavier's bound, nearly reached
    assert out["biases"] == 0.0, out


@pytest.fixture(scope="module")
def trained(oneflow_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("wide_deep_oneflow")
    oneflow_launch_runs(oneflow_python, "wide_deep_oneflow_rank.py", out, RUNS, "Wide & Deep")
    results: dict[str, Any] = {"reference": dict(np.load(out / "reference.npz")),
                               "start": dict(np.load(out / "start.npz"))}
    for name in RUNS:
        results[name] = [{**json.loads((out / f"{name}-{rank}.json").read_text()),
                          "params": dict(np.load(out / f"{name}-{rank}.npz"))}
                         for rank in (0, 1)]
    return results


def relative_diff(trained: dict[str, Any], name: str) -> float:
    """The largest difference of either rank's parameters from one process's, over the largest
    distance any parameter moved in its three steps."""
    reference, start = trained["reference"], trained["start"]
    moved = max(float(np.abs(reference[n] - start[n]).max()) for n in reference)
    assert moved > 0.01, moved  # training moved them: a comparison worth making
    diffs = []
    for rank in trained[name]:
        assert "error" not in rank, rank["error"]
        assert sorted(rank["params"]) == sorted(reference)  # every table and layer, whole
        diffs.append(max(float(np.abs(rank["params"][n] - reference[n]).max())
                         for n in reference))
    return max(diffs) / moved


@pytest.mark.parametrize("name", ["ddp2", "emb2-rw", "emb2-dp"])
def test_two_ranks_train_what_one_process_trains(trained: dict[str, Any], name: str) -> None:
    diff = relative_diff(trained, name)
    print(f"{name}: max |diff| / max move {diff:.3g}")
    assert diff < SAME, f"{name}: the parameters differ from one process's by {diff:.3g}"
    ranks = trained[name]
    assert ranks[0]["environment"]["data_parallel_ranks"] == 2  # a batch of each rank's own
    if name.startswith("emb"):
        # The global batch's loss, the same on both ranks (not a rank's partial sum).
        assert ranks[0]["loss"] == ranks[1]["loss"]
        assert ranks[0]["environment"]["layout"] == name
        assert 0.3 < ranks[0]["loss"] < 1.5, ranks[0]["loss"]


def test_a_wrong_data_split_is_seen(trained: dict[str, Any]) -> None:
    # Both ranks trained on rank 0's batch: the same code and weights, another global batch.
    diff = relative_diff(trained, "emb2-rw-wrong-split")
    assert diff > 100 * SAME, f"a wrong data split moved the parameters by {diff:.3g} only"


def test_each_rank_holds_half_the_rows(trained: dict[str, Any]) -> None:
    """emb2-rw: each rank's shard of each table is half its rows (all its columns), so its
    tables take half the bytes they take under DDP; emb2-dp keeps them whole."""
    shards = {"wide_embedding.weight": [VOCAB // 2, 1],
              "deep_embedding.weight": [VOCAB // 2, WIDTH]}
    table_bytes = VOCAB * (WIDTH + 1) * 4
    for rank in (0, 1):
        rw, ddp = trained["emb2-rw"][rank], trained["ddp2"][rank]
        assert rw["local_shapes"] == shards, rw["local_shapes"]
        assert ddp["held"] - rw["held"] == table_bytes // 2, (ddp["held"], rw["held"])
        assert trained["emb2-dp"][rank]["held"] == ddp["held"]
    assert trained["emb2-rw"][0]["environment"]["sharded_modules"]["emb"] == {
        "plan": "rw", "tables": {
            name: [[0, 0, 0, VOCAB // 2, columns], [1, VOCAB // 2, 0, VOCAB // 2, columns]]
            for name, columns in (("wide_embedding", 1), ("deep_embedding", WIDTH))}}
    assert trained["emb2-dp"][0]["environment"]["sharded_modules"]["emb"]["tables"] == {
        "wide_embedding": [[-1, 0, 0, -1, -1]], "deep_embedding": [[-1, 0, 0, -1, -1]]}


def test_what_oneflow_does_not_run_is_refused_saying_why(trained: dict[str, Any]) -> None:
    for rank in (0, 1):
        assert "tw: table-wise" in trained["emb2-tw"][rank]["error"]
        assert "not ported to OneFlow" in trained["emb2-tw"][rank]["error"]
        assert "separated_header_mem_ptr" in trained["emb2-rw-graph"][rank]["error"]
