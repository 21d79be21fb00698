"""Wide & Deep on OneFlow: torch's model (torch's weights give torch's loss, the ids follow
torch's power law, initialized as torch's: the port contract's, tests/ports.py, checked in
tests/test_ports.py) and, with its tables split by rows over two ranks (``emb-rw``, OneFlow-Benchmark's way: global tensors,
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
from typing import Any

import numpy as np
import pytest
from snippets import oneflow_launch_runs

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
