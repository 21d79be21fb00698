"""The built-in GPT: its parameter counts (GPT-2 124M, Llama 3 8B on the meta device), its FLOPs
per token by formula against a hand computation and against FlopCounterMode, its tensor-parallel
plan and pipeline split, a CPU training case through the plain torch adapter, and an MFU above
100% failing the case naming the peak. That two tensor-parallel ranks train what one process
trains is the port contract's (tests/ports.py's row, tests/port_gpt.py's job, run by
tests/test_ports_ranks.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_dlperf.core.parallel import Layout
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.core.workload import BuildContext, Workload, WorkloadError
from pytest_dlperf.models import BUILTIN, gpt
from pytest_dlperf.models.gpt import torch as gpt_torch
from pytest_dlperf.plugin import flops as pytest_flops
from pytest_dlperf.rank import flops as rank_flops
from pytest_dlperf.verdict import mfu

# At import, before any pytester snapshot of sys.modules (tests/test_own_model.py says why).
torch = pytest.importorskip("torch")


def built(sizes: dict[str, Any]) -> int:
    model = gpt_torch.build(gpt.GPTShape.of(sizes), "meta")
    return sum(p.numel() for p in model.parameters())


def context(sizes: dict[str, Any], device: str = "cpu", batch: int = 2,
            layout: Layout | None = None, rank: int = 0) -> BuildContext:
    return BuildContext("torch", "cpu", device, batch, sizes, "fp32", "float32", False, 0, rank,
                        layout.world_size if layout else 1, rank, layout=layout)


def test_gpt2_124m_has_124_475_904_parameters() -> None:
    assert BUILTIN["gpt"] is gpt.WORKLOAD
    assert gpt.WORKLOAD.sizes_for("cuda", "fp32") == gpt.GPT2_124M
    # wte 50,304 x 768 (tied: the head's too) + wpe 1,024 x 768 + 12 blocks of 7,087,872 (LN
    # 1,536, Q/K/V 1,771,776, out 590,592, LN 1,536, MLP 2,362,368 + 2,360,064) + LN_f 1,536.
    assert built(gpt.GPT2_124M) == gpt.parameter_count(gpt.GPT2_124M) == 124_475_904
    # Unpadded: transformers' gpt2, 124,439,808.
    assert built({**gpt.GPT2_124M, "vocab_size": 50257}) == 124_439_808
    assert built(gpt.CPU_SIZES) == gpt.parameter_count(gpt.CPU_SIZES) == 867_072


def test_llama3_8b_has_8_030_261_248_parameters() -> None:
    # Embedding and head 128,256 x 4,096 each, 32 blocks of 218,112,000 (Q, O 4,096^2; K, V
    # 4,096 x 1,024; w1, w2, w3 4,096 x 14,336; two RMSNorms), the final RMSNorm.
    assert built(gpt.LLAMA3_8B) == gpt.parameter_count(gpt.LLAMA3_8B) == 8_030_261_248


def test_flops_per_token_are_6n_plus_12lhqt() -> None:
    # GPT-2 124M: N = 124,475,904 - the 786,432 learned positions (the tied embedding is the
    # head's matrix and stays in); 12 L H Q T = 12 x 12 x 12 x 64 x 1,024.
    n = 124_475_904 - 1024 * 768
    assert gpt.GPTShape.of(gpt.GPT2_124M).flops_per_token() == 6 * n + 113_246_208 == 855_383_040
    assert gpt.flops_per_sequence(gpt.GPT2_124M) == 1024 * 855_383_040
    # Llama 3 8B: N = 8,030,261,248 - the 525,336,576 of the (untied) token embedding.
    n = 8_030_261_248 - 128_256 * 4096
    per_token = 6 * n + 12 * 32 * 32 * 128 * 8192
    assert gpt.GPTShape.of(gpt.LLAMA3_8B).flops_per_token() == per_token == 57_914_449_920


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_flop_counter_mode_agrees_with_the_formula_but_for_the_vectors(arch: str) -> None:
    """FlopCounterMode counts the products only: the formula's 6N less the 1-D parameters
    (biases, norms), and the same attention, with the rank's counting path ignoring the case's
    layout (8 pipeline stages of a 4-layer model would be refused by the recipe)."""
    sizes = {**gpt.CPU_SIZES, "arch": arch, "num_kv_heads": 2 if arch == "llama" else 4}
    workload = Workload("gpt_small", gpt.WORKLOAD.recipes, sizes=sizes,
                        units_per_sample="seq_length", layouts=("dp", "fsdp", "tp", "pp"))
    spec = spec_for("torch", workload, protocol=QUICK, device_type="cpu", batch_size=2,
                    layout=Layout(pp=8))
    with pytest.raises(WorkloadError, match="8 pipeline stages"):
        gpt_torch.recipe(spec.context(0, 8, 0, "meta"))
    counted = rank_flops.count(spec)
    assert counted["source"] == "FlopCounterMode (meta)"
    model = gpt_torch.build(gpt.GPTShape.of(sizes), "meta")
    vectors = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    seq = int(sizes["seq_length"])
    assert counted["flops_per_sample"] == gpt.flops_per_sequence(sizes) - 6 * vectors * seq


def test_the_formula_is_the_case_count_and_mfu_is_per_token() -> None:
    sized = gpt.WORKLOAD.sizes_for("cpu", "fp32")
    from pytest_dlperf.core.workload import CaseWorkload

    case = CaseWorkload.of(gpt.WORKLOAD, "cpu", "fp32")
    assert case.units_per_sample == 64 and case.unit == "tokens"
    count = pytest_flops.flops_per_sample(gpt.WORKLOAD, case, QUICK, "cpu", None, Path("."))
    assert count.source == "workload" and count.per_sample == gpt.flops_per_sequence(sized)
    assert count.per_unit == gpt.GPTShape.of(sized).flops_per_token() == 5_546_496
    # 10,000 tokens/s per device against a 1 PFLOP/s peak.
    used = pytest_flops.utilization(count, 10_000.0, "float32", {}, None, 1e15)
    assert used.achieved_flops_per_s == 10_000 * 5_546_496
    assert used.mfu == pytest.approx(10_000 * 5_546_496 / 1e15)


def test_a_formula_that_fails_is_a_problem_not_a_crash() -> None:
    def broken(sizes: Any) -> float:
        raise KeyError("hidden")

    workload = Workload("w", {"torch": "m:f"}, flops_per_sample=broken)
    from pytest_dlperf.core.workload import CaseWorkload

    count = pytest_flops.flops_per_sample(workload, CaseWorkload.of(workload, "cpu", "fp32"),
                                          QUICK, "cpu", None, Path("."))
    assert count.per_sample is None and "KeyError" in str(count.problem)
    with pytest.raises(WorkloadError, match="function of the case's sizes"):
        Workload("w", {"torch": "m:f"}, flops_per_sample=-1.0)


def test_an_mfu_above_100_percent_is_an_error_naming_the_peak() -> None:
    count = mfu.FlopsCount(1024 * 855_383_040.0, "workload", units_per_sample=1024,
                           unit="tokens")
    peak = mfu.peak_for("NVIDIA H100 80GB HBM3", "tf32")
    assert peak is not None
    achieved = 855_383_040 * 1e6  # 1M tokens/s per device: 855 TFLOP/s, above TF32's 494.7
    with pytest.raises(mfu.ImpossibleMFU) as raised:
        mfu.model_flops_utilization(achieved, peak, count, 1e6)
    text = str(raised.value)
    assert "MFU 172.9% is above 100%" in text
    assert "4.947e+14 FLOP/s at tf32 from pytest-dlperf's table of dense peaks" in text
    assert "'NVIDIA H100 80GB HBM3'" in text and "8.554e+08 FLOP per token" in text
    assert "--dlperf-peak-flops" in text
    bf16 = mfu.peak_for("NVIDIA H100 80GB HBM3", "bf16")
    assert bf16 is not None and bf16.flops_per_s == 989.4e12  # dense; 1,979 is with sparsity
    assert mfu.model_flops_utilization(achieved, bf16, count, 1e6) == pytest.approx(0.8646,
                                                                                     abs=1e-4)
    nvl = mfu.peak_for("NVIDIA H200 NVL", "bf16")
    assert nvl is not None and nvl.flops_per_s == 835.5e12


def test_the_tp_plan_and_pipeline_split_name_the_model() -> None:
    shape = gpt.GPTShape.of({**gpt.CPU_SIZES, "arch": "llama", "num_kv_heads": 2})
    model = gpt_torch.build(shape, "meta")
    names = {name for name, _ in model.named_modules()}
    plan = gpt_torch.tp_plan(shape)
    assert set(plan) <= names and "output" in plan and "layers.3.feed_forward.w3" in plan
    assert "output" not in gpt_torch.tp_plan(gpt.GPTShape.of(gpt.CPU_SIZES))  # tied: follows wte
    assert gpt.pipeline_split(shape, 2) == ["layers.2"]
    assert gpt.pipeline_split(gpt.GPTShape.of(gpt.GPT2_124M), 4) == [
        "layers.3", "layers.6", "layers.9"]
    parts = gpt_torch.recipe(context(dict(gpt.CPU_SIZES), "meta", layout=Layout(pp=2)))
    assert parts.plan("tp") is None and parts.plan("pp") == ["layers.2"]
    interleaved = Layout(pp=2, schedule="interleaved1f1b")
    parts = gpt_torch.recipe(context(dict(gpt.CPU_SIZES), "meta", layout=interleaved))
    assert parts.plan("pp") == ["layers.1", "layers.2", "layers.3"]
    assert gpt_torch.recipe(context(dict(gpt.CPU_SIZES), "meta")).plan("tp") is None
    with pytest.raises(WorkloadError, match="num_heads"):
        gpt_torch.recipe(context(dict(gpt.CPU_SIZES), "meta", layout=Layout(tp=8)))


PERF = """
def test_gpt(throughput_meter):
    report = throughput_meter.measure("torch", "gpt")
    assert report.environment.parameters == 867_072
"""
RUN = ("-p", "no:cacheprovider", "--dlperf-protocol", "quick", "--dlperf-unstable-cv", "50",
       "--devices-per-node", "1", "--dlperf-baselines", "bl", "--dlperf-update-baselines")


@pytest.mark.usefixtures("subprocess_env")
def test_the_small_gpt_trains_on_the_cpu_in_tokens_per_second(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_perf=PERF)
    result = pytester.runpytest_subprocess(*RUN, "--dlperf-json", "r.json", timeout=300)
    result.assert_outcomes(passed=1)  # a loss that is not finite fails the case
    (info,) = (b["extra_info"] for b in json.loads((pytester.path / "r.json").read_text())[
        "benchmarks"])
    assert info["flops_source"] == "workload"
    assert info["flops_per_sample"] == 64 * 5_546_496
    # a CPU: against a core's measured GEMM rate times the rank's threads (issue 74)
    assert info["mfu"] > 0 and info["mfu_peak"]["device"] == "measured GEMM"
    assert info["mfu_peak"]["cores"] == info["environment"]["threads"]


@pytest.mark.usefixtures("subprocess_env")
def test_an_mfu_above_100_percent_fails_the_case_naming_the_peak(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_perf=PERF)
    result = pytester.runpytest_subprocess(*RUN, "--dlperf-peak-flops", "1e6", timeout=300)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*pytest-dlperf: MFU *% is above 100%: * FLOP/s per device achieved (5.546e+06 FLOP "
        "per token (workload) x * tokens/s per device) against a peak of * FLOP/s at fp32 "
        "from --dlperf-peak-flops (1e+06 FLOP/s a core x * thread(s) a rank).*give a core's "
        "dense fp32 peak with --dlperf-peak-flops*"])
