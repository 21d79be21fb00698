"""Issue 55's workload: Wide & Deep as DLPerf's scripts build it (its parameters by the formula at
every rung of both ladders), and its synthetic ids (in range, skewed as click logs are, each
slot's hot rows apart, drawn again every step, reproducible by seed, apart by rank)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pytest_dlperf.core.sweep import parse_ladder  # noqa: E402
from pytest_dlperf.core.workload import BuildContext, WorkloadError  # noqa: E402
from pytest_dlperf.models import BUILTIN, wide_deep  # noqa: E402

torch = pytest.importorskip("torch")
from pytest_dlperf.models.wide_deep import torch as wide_deep_torch  # noqa: E402


def sizes(device: str = "cpu", **over: Any) -> dict[str, Any]:
    return {**wide_deep.WORKLOAD.sizes_for(device, "fp32"), **over}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_parameters_are_the_formulas_at_every_rung(device: str) -> None:
    ladder = wide_deep.CPU_LADDER if device == "cpu" else wide_deep.CUDA_LADDER
    for vocab in parse_ladder(ladder):
        shape = wide_deep.WideDeepShape.of(sizes(device, vocab=vocab))
        model = wide_deep_torch.build(shape, device="meta")
        counted = sum(p.numel() for p in model.parameters())
        # V x (D + 1) of tables; (26 D + 13) x 1024 in, (L - 1) hidden 1024 x 1024, 1024 -> 1
        d, layers = int(shape.deep_width), shape.hidden_layers
        assert counted == wide_deep.parameter_count(shape.__dict__) == (
            vocab * (d + 1) + (26 * d + 13) * 1024 + 1024
            + (layers - 1) * (1024 * 1024 + 1024) + 1024 + 1), vocab
    assert BUILTIN["wide_deep"] is wide_deep.WORKLOAD
    # The CPU ladder's first and last: the 4,890,945 and 55,890,945.
    assert wide_deep.parameter_count(sizes(vocab=200_000)) == 4_890_945
    assert wide_deep.parameter_count(sizes(vocab=3_200_000)) == 55_890_945


def test_a_row_costs_its_entries_times_the_copies_kept_over_the_shards() -> None:
    assert wide_deep.bytes_per_row(sizes()) == 17 * 4 * 4
    assert wide_deep.bytes_per_row(sizes(), copies=3) == 204  # DLPerf's OneFlow 0.2: 203.9
    assert wide_deep.bytes_per_row(sizes(deep_width=32), copies=3, shards=2) == 33 * 3 * 4 / 2


@pytest.mark.parametrize(("over", "says"), [
    ({"vocab": 0}, "size 'vocab' must be a positive integer"),
    ({"dropout": 1.0}, "dropout must be in [0, 1)"),
    ({"zipf": 0}, "zipf (the ids' power-law exponent) must be > 0"),
    ({"vocab": 2 * wide_deep.SCATTER}, "is a multiple of 1000003")])
def test_bad_sizes_are_the_workloads_errors(over: dict[str, Any], says: str) -> None:
    with pytest.raises(WorkloadError, match=re.escape(says)):
        wide_deep.WideDeepShape.of(sizes(**over))


def context(rank: int = 0, seed: int = 0, batch: int = 4096, **over: Any) -> BuildContext:
    return BuildContext("torch", "cpu", "cpu", batch, sizes(**over), "fp32", "float32", False,
                        seed, rank, 2, rank)


def test_ids_are_skewed_in_range_and_drawn_again_every_step() -> None:
    parts = wide_deep_torch.recipe(context(vocab=200_000))
    dense, wide, deep = (t.clone() for t in parts.inputs())
    assert dense.shape == (4096, 13) and wide.shape == (4096, 2) and deep.shape == (4096, 26)
    for ids in (wide, deep):
        assert ids.dtype == torch.long and 0 <= int(ids.min()) and int(ids.max()) < 200_000
    # Skewed: one slot's hottest row takes far more than a uniform draw's 4096 / 200k.
    first = deep[:, 0]
    counts = torch.bincount(first, minlength=200_000)
    assert int(counts.max()) > 100 and int((counts > 0).sum()) < 4096
    # Each slot's hot rows sit elsewhere in the table.
    hottest = {int(torch.bincount(deep[:, s]).argmax()) for s in range(26)}
    assert len(hottest) == 26
    # The next step's ids are drawn afresh (the rows touched move), the labels too.
    _, _, later = parts.inputs()
    assert not torch.equal(later, deep)
    labels = parts.targets().clone()
    assert set(labels.unique().tolist()) == {0.0, 1.0}


def test_ids_follow_the_seed_and_differ_by_rank() -> None:
    def first_ids(rank: int, seed: int) -> Any:
        return wide_deep_torch.recipe(context(rank, seed, vocab=200_000)).inputs()[2].clone()

    assert torch.equal(first_ids(0, 7), first_ids(0, 7))
    assert not torch.equal(first_ids(0, 7), first_ids(1, 7))
    assert not torch.equal(first_ids(0, 7), first_ids(0, 8))


def test_every_rank_builds_the_same_weights() -> None:
    one, two = (wide_deep_torch.recipe(context(rank, vocab=50_000)).model for rank in (0, 1))
    for (name, a), (_, b) in zip(one.state_dict().items(), two.state_dict().items()):
        assert torch.equal(a, b), name
    table = one.deep_embedding.weight
    assert float(table.detach().abs().max()) <= 0.05  # uniform(-0.05, 0.05), as DLPerf's scripts


def test_on_the_meta_device_the_recipe_holds_no_weights() -> None:
    # FLOPs are counted in rank 0 after its windows on the meta device: tables built on the CPU
    # there would add the whole model (3.2M rows: 218 MB) to what the rank holds.
    ctx = BuildContext("torch", "cpu", "meta", 8, sizes(), "fp32", "float32", False, 7, 0, 1, 0)
    parts = wide_deep_torch.recipe(ctx)
    assert {p.device.type for p in parts.model.parameters()} == {"meta"}
