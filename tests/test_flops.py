"""FLOPs per sample of the built-in workloads at DLPerf's sizes, counted the way the plugin counts
them for a TensorFlow or OneFlow case (torch's FlopCounterMode in a subprocess, on the meta
device), against figures worked out by hand; and the peak table's lookup by NVML name."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_dlperf.core import units
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.models import BERT_BASE, RESNET50
from pytest_dlperf.models.bert import BERT_BASE as SHAPE
from pytest_dlperf.plugin import flops as pytest_flops
from pytest_dlperf.verdict import mfu

pytest.importorskip("torch")


def test_resnet50_v15_at_224_is_about_24_5_gflop_an_image(tmp_path: Path) -> None:
    spec = spec_for("torch", RESNET50, protocol=QUICK, device_type="cuda", batch_size=4)
    assert spec.sizes["image_size"] == 224
    count = pytest_flops.count_in_subprocess(spec, tmp_path)
    assert count.source == "FlopCounterMode (meta)" and count.problem is None
    # 4.09 G multiply-adds forward (He et al.; v1.5's stride moved to the 3x3 conv adds ~0.1 G),
    # 2 FLOPs each, backward twice the forward (the first conv needs no input gradient).
    assert count.per_sample == pytest.approx(3 * 2 * 4.09e9, rel=0.03)


@pytest.mark.outside_ci(
    "25 s, CI's 35 minutes (issue 54): ResNet-50's count matches its arithmetic in CI "
    "by the same counter (above)")
def test_bert_base_pretraining_flops_match_the_arithmetic(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    spec = spec_for("torch", BERT_BASE, protocol=QUICK, device_type="cuda", batch_size=2)
    s, m = int(spec.sizes["seq_length"]), int(spec.sizes["max_predictions_per_seq"])
    assert (s, m) == (128, 20)
    h, i = SHAPE.hidden_size, SHAPE.intermediate_size
    layers, vocab = SHAPE.num_layers, SHAPE.vocab_size
    per_layer = (4 * 2 * s * h * h  # Q, K, V and output projections
                 + 2 * 2 * s * h * i  # the feed-forward pair
                 + 2 * 2 * s * s * h)  # scores and the weighted sum of values
    heads = (2 * h * h + 2 * h * 2  # pooler on [CLS], next-sentence classifier
             + 2 * m * h * h + 2 * m * h * vocab)  # MLM transform and decoder, masked positions
    forward = layers * per_layer + heads
    count = pytest_flops.count_in_subprocess(spec, tmp_path)
    # transformers reads the attention mask's values (all ones: attention may skip it), which
    # the meta device has none of: counted on the CPU at batch 1 instead, and said so.
    assert count.source == "FlopCounterMode (cpu, batch 1)"
    assert "meta tensors" in str(count.problem)
    # Backward: input and weight gradients of every product (the embeddings feed the first).
    assert count.per_sample == pytest.approx(3 * forward, rel=0.01)


@pytest.mark.parametrize(("name", "precision", "peak"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),  # SXM5
    ("NVIDIA H100 80GB HBM3", "tf32", 494.7e12),
    ("NVIDIA H100 PCIe", "bf16", 756.5e12),  # not the SXM figure: the PCIe card is slower
    ("NVIDIA A100-SXM4-80GB", "fp16", 312e12),
    ("NVIDIA A100-PCIE-40GB", "fp32", 19.5e12),
    ("Tesla V100-SXM2-16GB", "fp16", 125e12),
    ("Tesla V100-PCIE-32GB", "fp16", 112e12),
    ("Tesla V100-SXM2-16GB", "bf16", None),  # V100 has no bf16
    ("NVIDIA GeForce RTX 4090", "bf16", None),  # not in the table
    (None, "fp32", None),  # a CPU
])
def test_peaks_are_found_by_nvml_name(name: str | None, precision: str,
                                      peak: float | None) -> None:
    found = mfu.peak_for(name, precision)
    assert (found.flops_per_s if found else None) == peak


def test_the_users_peak_wins_and_tf32_counts_where_the_framework_allows_it() -> None:
    override = mfu.peak_for("NVIDIA H100 80GB HBM3", "bf16", override=2e15)
    assert override is not None and override.flops_per_s == 2e15
    assert mfu.math_precision("float32", {"tf32": True}) == "tf32"
    assert mfu.math_precision("float32", {"tf32": False}) == "fp32"
    assert mfu.math_precision("bfloat16", {"tf32": True}) == "bf16"


@pytest.mark.parametrize(("text", "value"), [("989.4T", 989.4e12), ("1P", 1e15),
                                             ("5e11", 5e11), ("250g", 250e9)])
def test_flops_figures_parse_with_suffixes(text: str, value: float) -> None:
    assert units.parse_flops(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["fast", "-1T", "0"])
def test_bad_flops_figures_say_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match="FLOP/s"):
        units.parse_flops(text)


def test_a_case_without_mfu_says_why() -> None:
    """Issue 52: --dlperf-peak-flops was ignored without a word where the FLOPs were unknown."""
    unknown = mfu.FlopsCount(None, "none", "counting FLOPs failed: RuntimeError: shapes")
    used = pytest_flops.utilization(unknown, 100.0, "float16", {}, None, 1e11)
    assert used.mfu is None and used.missing == (
        "its FLOPs per sample are unknown (counting FLOPs failed: RuntimeError: shapes); "
        "--dlperf-peak-flops 1e+11 is not used without them")
    counted = mfu.FlopsCount(2e6, "workload")
    used = pytest_flops.utilization(counted, 100.0, "float32", {}, None, None)
    assert used.achieved_flops_per_s == 2e8 and used.mfu is None
    assert used.missing == ("the peak FLOP/s of this CPU in fp32 is not known: give it with "
                            "--dlperf-peak-flops")
    assert pytest_flops.utilization(counted, 100.0, "float16", {}, None, 1e9).missing is None
