"""FLOPs per sample of the built-in workloads at DLPerf's sizes, counted the way the plugin counts
them for a TensorFlow or OneFlow case (torch's FlopCounterMode in a subprocess, on the meta
device), against figures worked out by hand; and the peak table's lookup by NVML name."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_dlperf.core import units
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.models import BERT_BASE, RESNET50
from pytest_dlperf.models.bert import BERT_BASE as SHAPE
from pytest_dlperf.plugin import flops as pytest_flops
from pytest_dlperf.plugin.settings import host_identity
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


def test_a_cpu_peak_belongs_to_a_core_and_a_rank_has_its_threads() -> None:
    """Issue 74: --dlperf-peak-flops 80G read MFU 79.5% on a 1n2d case (one thread a rank) and
    failed the 1n1d case (two threads) at 151.8%: a CPU rank's peak is a core's times its
    threads, so the same rank speed per thread reads the same MFU on both."""
    counted = mfu.FlopsCount(1e6, "workload")
    one, two = (pytest_flops.utilization(counted, 63_600.0 * threads, "float32", {}, None,
                                         80e9, device_type="cpu", threads=threads)
                for threads in (1, 2))
    assert one.mfu == pytest.approx(two.mfu) == pytest.approx(0.795)
    assert (one.peak.flops_per_s, two.peak.flops_per_s) == (80e9, 160e9)
    assert two.peak.to_json()["per_core_flops_per_s"] == 80e9 and two.peak.to_json()["cores"] == 2
    # a GPU's peak is the device's, whatever the threads of its rank's host process
    gpu = pytest_flops.utilization(counted, 1e4, "float32", {}, None, 80e9, threads=2)
    assert gpu.peak.flops_per_s == 80e9 and gpu.peak.per_core is None


def test_without_a_peak_a_cpu_case_takes_a_measured_gemm_rate_and_says_so() -> None:
    counted = mfu.FlopsCount(1e6, "workload")
    rates = {"fp32": 50e9, "bf16": 200e9, "library": "torch 2.x", "n": 1024,
             "date": "2026-12-06"}
    fp32 = pytest_flops.utilization(counted, 40_000.0, "float32", {}, None, None,
                                    device_type="cpu", threads=2, gemm=lambda: rates)
    assert fp32.mfu == pytest.approx(0.4) and fp32.peak.device == mfu.MEASURED
    assert "not the hardware's peak" in fp32.peak.source and "2026-12-06" in fp32.peak.source
    amp = pytest_flops.utilization(counted, 40_000.0, "bfloat16", {}, None, None,
                                   device_type="cpu", threads=2, gemm=lambda: rates)
    assert amp.peak.precision == "bf16" and amp.mfu == pytest.approx(0.1)
    # a measured rate is no ceiling: a model above it is shown, not failed
    above = pytest_flops.utilization(counted, 120_000.0, "float32", {}, None, None,
                                     device_type="cpu", threads=1, gemm=lambda: rates)
    assert above.mfu == pytest.approx(2.4)
    # nothing measured in the precision: missing, naming the flag
    none = pytest_flops.utilization(counted, 1.0, "float32", {}, None, None,
                                    device_type="cpu", threads=1, gemm=lambda: None)
    assert none.mfu is None and "--dlperf-peak-flops" in (none.missing or "")
    # the notes under the table say what each CPU case's MFU was taken against
    bench = {"extra_info": {"case": "t[1n1d-fp32]", "mfu": 0.4,
                            "mfu_peak": fp32.peak.to_json(), "mfu_missing": None}}
    from pytest_dlperf.report.tables import mfu_notes
    assert mfu_notes([bench]) == [
        "pytest-dlperf: MFU of t[1n1d-fp32] against 50.0 GFLOP/s a core at fp32 x 2 thread(s) "
        "a rank, a dense GEMM measured here (torch 2.x, 1024x1024 matrices, one thread, "
        "2026-12-06; not the hardware's peak)"]


def test_the_gemm_rate_is_measured_once_per_machine_and_cpu(tmp_path: Path) -> None:
    kept = tmp_path / "cache" / "cpu-gemm.json"
    first = pytest_flops.measured_gemm(kept, "m1", "Some CPU")
    assert first is not None and first["fp32"] > 1e8 and first["bf16"] > 0
    assert first["library"].startswith("torch ") and first["n"] == 1024
    assert list(json.loads(kept.read_text())) == ["m1|Some CPU"]
    # kept: asked again, the same figures without measuring (a measurement never repeats one)
    assert pytest_flops.measured_gemm(kept, "m1", "Some CPU") == first
    # another machine, or another CPU under the machine's name, is measured for itself
    other = pytest_flops.measured_gemm(kept, "m1", "Another CPU")
    assert other is not None and sorted(json.loads(kept.read_text())) == [
        "m1|Another CPU", "m1|Some CPU"]
    # an unreadable file is measured again and written anew
    kept.write_text("{not json")
    assert pytest_flops.measured_gemm(kept, "m1", "Some CPU") is not None
    assert list(json.loads(kept.read_text())) == ["m1|Some CPU"]
    # where it lives: the user's cache folder, shared by every session on the machine
    assert pytest_flops.gemm_cache().parts[-2:] == ("pytest-dlperf", "cpu-gemm.json")


def test_a_kept_rate_belongs_to_the_computer_not_to_the_machine_label(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions of one computer under two --dlperf-machine labels (or on two local nodes, each a
    host name of its own) take the rate kept for the computer: measured once, not once a label
    (~20 s each on this project's VM)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rates = {"fp32": 4.2e10, "bf16": 8.8e8, "library": "torch 2.x", "n": 1024,
             "date": "2026-12-07"}
    kept = pytest_flops.gemm_cache()
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({f"{host_identity()}|Some CPU": rates}))
    for label in ("box", "runner"):
        state = SimpleNamespace(gemm=[], settings=SimpleNamespace(machine=label),
                                hardware=SimpleNamespace(cpu_model="Some CPU"))
        assert pytest_flops.session_gemm(state) == rates, label
    assert list(json.loads(kept.read_text())) == [f"{host_identity()}|Some CPU"]
