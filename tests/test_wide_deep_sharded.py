"""Wide & Deep's tables sharded over the ranks (the ``emb`` layout kind, TorchRec's sharders):
every plan trains what one process trains on the same global batch, each rank holds the shards
its plan gives it, and a plan that spreads the tables leaves less on each rank.

One torchrun job of two processes (tests/wide_deep_torch_rank.py) trains each run with the real
``TorchTrainer``, three AdamW steps in float32 (TorchRec's tables have no float64), and one
process trains the unsharded torch model on the runs' global batch."""

from __future__ import annotations

from typing import Any

import pytest
from snippets import torchrun_runs

pytest.importorskip("torchrec", reason="TorchRec shards the tables (scripts/setup installs it)")

# name: (layout, world, options)
RUNS: dict[str, tuple[str | None, int, dict[str, Any]]] = {
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
    "emb2-rw-wrong-split": ("emb-rw", 2, {"wrong_split": 1}),
}
# float32, reduction orders apart: at most this share of how far any parameter moved
SAME = 1e-4


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import torch
    from wide_deep_torch_rank import reference_name

    out = tmp_path_factory.mktemp("wide_deep_sharded")
    runs = torchrun_runs("wide_deep_torch_rank.py", out, RUNS)
    results = {}
    for run in runs:
        result = torch.load(out / f"{run['name']}.pt", weights_only=False)
        result["reference"] = torch.load(
            out / reference_name(run["world"], "sparse" in str(run["layout"])),
            weights_only=False)
        results[run["name"]] = result
    return results


def relative_diff(result: dict[str, Any]) -> float:
    """The largest difference from one process's parameters, over the largest distance any
    parameter moved in its three steps."""
    params, reference = result["params"], result["reference"]
    assert sorted(params) == sorted(reference["params"])  # every table and layer, whole
    moved = max(float((reference["params"][n] - reference["start"][n]).abs().max())
                for n in params)
    return max(float((params[n] - reference["params"][n]).abs().max()) for n in params) / moved


@pytest.mark.parametrize("name", [name for name in RUNS if "wrong" not in name])
def test_a_plan_trains_what_one_process_trains(trained: dict[str, Any], name: str) -> None:
    diff = relative_diff(trained[name])
    print(f"{name}: max |diff| / max move {diff:.3g}")
    assert diff < SAME, f"{name}: the parameters differ from one process's by {diff:.3g}"
    layout, world, _ = RUNS[name]
    env = trained[name]["environment"]
    assert env["data_parallel_ranks"] == world  # every rank trains on a batch of its own
    if layout is not None:
        assert env["layout"] == name.split("-", 1)[0] + "-" + layout.split("-")[1]


def test_a_wrong_data_split_is_seen(trained: dict[str, Any]) -> None:
    # Both ranks trained on rank 0's batch: the same code and weights, another global batch.
    diff = relative_diff(trained["emb2-rw-wrong-split"])
    assert diff > 0.05, f"a wrong data split moved the parameters by {diff:.3g} only"


def shards(result: dict[str, Any]) -> dict[str, list[list[int]]]:
    return result["environment"]["sharded_modules"]["emb"]["tables"]


def test_each_rank_holds_the_shards_of_its_plan(trained: dict[str, Any]) -> None:
    from wide_deep_torch_rank import SIZES

    vocab, width = SIZES["vocab"], SIZES["deep_width"]
    # [rank, first row, first column, rows, columns]; the biggest table placed first
    assert shards(trained["emb2-tw"]) == {"tables.deep": [[0, 0, 0, vocab, width]],
                                          "tables.wide": [[1, 0, 0, vocab, 1]]}
    assert shards(trained["emb2-cw"]) == {
        "tables.deep": [[0, 0, 0, vocab, width // 2], [1, 0, width // 2, vocab, width // 2]],
        "tables.wide": [[0, 0, 0, vocab, 1]]}  # one column: whole, on the least loaded rank
    assert shards(trained["emb2-twcw"]) == shards(trained["emb2-cw"])
    assert shards(trained["emb2-rw"]) == {
        name: [[0, 0, 0, vocab // 2, columns], [1, vocab // 2, 0, vocab // 2, columns]]
        for name, columns in (("tables.deep", width), ("tables.wide", 1))}
    assert shards(trained["emb2-dp"]) == {"tables.deep": [[-1, 0, 0, -1, -1]],
                                          "tables.wide": [[-1, 0, 0, -1, -1]]}
    # emb-sparse: torch's own tables, whole on every rank
    assert shards(trained["emb2-sparse"]) == {"deep_embedding": [[-1, 0, 0, -1, -1]],
                                              "wide_embedding": [[-1, 0, 0, -1, -1]]}


def test_a_plan_that_spreads_the_tables_leaves_less_on_each_rank(
        trained: dict[str, Any]) -> None:
    from wide_deep_torch_rank import SIZES

    table_bytes = SIZES["vocab"] * (SIZES["deep_width"] + 1) * 4
    whole = trained["ddp2"]["bytes_per_rank"]
    assert trained["emb2-dp"]["bytes_per_rank"] == whole
    tower = whole[0] - table_bytes
    rw = trained["emb2-rw"]["bytes_per_rank"]
    assert rw == [tower + table_bytes // 2] * 2, (rw, whole)
    for name in ("emb2-tw", "emb2-cw"):
        held = trained[name]["bytes_per_rank"]
        assert max(held) < whole[0] and sum(held) == 2 * tower + table_bytes, (name, held)
