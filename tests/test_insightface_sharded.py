"""InsightFace's head split over the ranks by class (the ``pfc`` layout kind, torch's strategy in
frameworks/torch/classes.py): class-parallel ranks train what one process with the whole head
trains on the same global batch, a wrong label offset is seen, each rank holds its share of the
classes, and Partial FC keeps every class of the batch among the centres it samples.

One torchrun job of two processes (tests/insightface_torch_rank.py) trains each run with the real
``TorchTrainer``, three SGD steps (momentum, weight decay) in float64, and one process trains the
whole model on the runs' global batch."""

from __future__ import annotations

from typing import Any

import pytest
from snippets import torchrun_runs

# name: (layout, world, options)
RUNS: dict[str, tuple[str | None, int, dict[str, Any]]] = {
    "ddp2": (None, 2, {}),
    "pfc1": ("pfc", 1, {}),
    "pfc2": ("pfc", 2, {}),
    "pfc2-r1": ("pfc-r1", 2, {}),  # Partial FC keeping every centre: model parallel again
    "pfc2-r0.5": ("pfc-r0.5", 2, {}),
    "pfc2-wrong-offset": ("pfc", 2, {"wrong_offset": 1}),
}
SAME = 1e-9  # float64: reduction orders apart, of how far any parameter moved


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import torch

    out = tmp_path_factory.mktemp("insightface_sharded")
    runs = torchrun_runs("insightface_torch_rank.py", out, RUNS)
    results = {}
    for run in runs:
        result = torch.load(out / f"{run['name']}.pt", weights_only=False)
        result["reference"] = torch.load(out / f"reference-{run['world']}.pt",
                                         weights_only=False)
        results[run["name"]] = result
    return results


def relative_diff(result: dict[str, Any]) -> float:
    """The largest difference from one process's parameters, over the largest distance any
    parameter moved in its three steps."""
    params, reference = result["params"], result["reference"]
    assert sorted(params) == sorted(reference["params"])  # the backbone and the whole head
    moved = max(float((reference["params"][n] - reference["start"][n]).abs().max())
                for n in params)
    return max(float((params[n] - reference["params"][n]).abs().max()) for n in params) / moved


@pytest.mark.parametrize("name", ["ddp2", "pfc1", "pfc2", "pfc2-r1"])
def test_class_parallel_ranks_train_what_one_process_trains(trained: dict[str, Any],
                                                            name: str) -> None:
    diff = relative_diff(trained[name])
    print(f"{name}: max |diff| / max move {diff:.3g}")
    assert diff < SAME, f"{name}: the parameters differ from one process's by {diff:.3g}"
    result = trained[name]
    assert result["environment"]["data_parallel_ranks"] == RUNS[name][1]
    # The last step's loss: the global batch's on every class-parallel rank (the softmax's
    # sums taken over the ranks), each replica's own batch's under DDP; reported in float32.
    losses, reference = result["losses"], result["reference"]["loss"]
    if name.startswith("pfc"):
        assert losses == pytest.approx([reference] * len(losses), rel=1e-6)
    else:
        assert sum(losses) / len(losses) == pytest.approx(reference, rel=1e-6)


def test_a_wrong_label_offset_is_seen(trained: dict[str, Any]) -> None:
    # Rank 1 read its labels as if its classes began at 0: the same weights, other targets.
    diff = relative_diff(trained["pfc2-wrong-offset"])
    assert diff > 0.01, f"a wrong label offset moved the parameters by {diff:.3g} only"


def test_each_rank_holds_its_share_of_the_classes(trained: dict[str, Any]) -> None:
    from insightface_torch_rank import SIZES

    classes = SIZES["num_classes"]
    assert trained["ddp2"]["head_rows"] == [classes, classes]
    assert trained["pfc1"]["head_rows"] == [classes]
    assert trained["pfc2"]["head_rows"] == [6, 5]  # the first rank takes the odd class
    notes = trained["pfc2-r0.5"]["environment"]["sharded_modules"]["pfc"]
    assert notes == {"head": "head", "classes": classes, "sample_ratio": 0.5,
                     "ranks": [[0, 0, 6], [1, 6, 5]]}


def test_partial_fc_keeps_the_batchs_classes_among_its_sampled_centres(
        trained: dict[str, Any]) -> None:
    seen = trained["pfc2-r0.5"]["seen"]  # rank 0's: classes 0..5, three kept a step
    assert len(seen) == 3
    for kept, labels in seen:
        mine = {int(c) for c in labels if c < 6}
        kept_set = {int(c) for c in kept}
        assert mine <= kept_set, (mine, kept_set)
        assert len(kept_set) == max(3, len(mine)) and kept_set <= set(range(6))
    assert len({tuple(int(c) for c in kept) for kept, _ in seen}) > 1  # drawn anew each step
