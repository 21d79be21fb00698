"""Library models as users bring them: a Hugging Face Llama built from a config trains with the
default loss (docs/own-model.md's block, run as it stands, on one and two ranks), and an output
the default loss cannot read is refused naming its type and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

# At import, before any pytester snapshot of sys.modules (tests/test_own_model.py says why).
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_docs_pages import first_python_block  # noqa: E402

from pytest_dlperf.frameworks.torch import cross_entropy  # noqa: E402

OWN_MODEL = Path(__file__).resolve().parents[1] / "docs" / "own-model.md"


def docs_example() -> str:
    """The Python block of docs/own-model.md's "A library's model" section."""
    return first_python_block(OWN_MODEL, after="\n## A library's model\n")


def test_the_default_loss_reads_a_library_models_output_object() -> None:
    logits = torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    plain = cross_entropy(logits, targets)
    # Hugging Face's output class, as its models return it
    output = transformers.modeling_outputs.CausalLMOutputWithPast(logits=logits)
    assert torch.equal(cross_entropy(output, targets), plain)
    assert torch.equal(cross_entropy({"logits": logits}, targets), plain)
    # the loss a model computed (from labels it was given) is the loss
    computed = torch.tensor(1.25)
    with_loss = transformers.modeling_outputs.CausalLMOutputWithPast(loss=computed,
                                                                     logits=logits)
    assert cross_entropy(with_loss, targets) is computed


@pytest.mark.parametrize("output", [(torch.randn(2, 7),), SimpleNamespace(hidden=1)],
                         ids=["tuple", "object"])
def test_an_output_the_default_loss_cannot_read_is_refused_naming_it_and_the_fix(
        output: object) -> None:
    with pytest.raises(TypeError) as caught:
        cross_entropy(output, torch.randint(0, 7, (2,)))
    message = str(caught.value)
    assert type(output).__qualname__ in message
    assert "Parts(..., loss=" in message and "docs/own-model.md" in message


@pytest.mark.usefixtures("subprocess_env")
def test_the_docs_hugging_face_llama_trains_with_the_default_loss_on_one_and_two_ranks(
        pytester: pytest.Pytester) -> None:
    (pytester.path / "test_hf_llama.py").write_text(docs_example())
    run = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-protocol", "quick", "--dlperf-repeats", "1",
        "--dlperf-warmup-steps", "2", "--dlperf-steps", "3", "--devices-per-node", "2",
        "--dlperf-json", "out.json", timeout=600)
    run.assert_outcomes(passed=2)
    cases = {b["name"]: b["extra_info"]
             for b in json.loads((pytester.path / "out.json").read_text())["benchmarks"]}
    assert sorted(cases) == ["test_hf_llama[1n1d]", "test_hf_llama[1n2d]"]
    for info in cases.values():
        assert info["unit"] == "tokens" and info["samples_per_s"] > 0
        # Hugging Face's Llama as configured, counted by hand: embedding and head 512 x 64
        # each (untied), per block q and o 64 x 64, k and v 64 x 32 (2 of 4 heads' 16),
        # SwiGLU 3 x 64 x 256, two RMSNorms; the final norm
        blocks = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 256 + 2 * 64)
        assert info["environment"]["parameters"] == 2 * 512 * 64 + blocks + 64
    # the FLOP counter ran the model's forward and the default loss's backward too
    assert cases["test_hf_llama[1n1d]"]["flops_per_sample"] > 0
    # MFU on a CPU (issue 74): no peak given, so against a core's measured GEMM rate times the
    # rank's threads: the 1n1d rank's (both cores) twice each 1n2d rank's (one core each)
    peaks = {name: info["mfu_peak"] for name, info in cases.items()}
    for name, info in cases.items():
        assert info["mfu"] > 0 and peaks[name]["device"] == "measured GEMM"
        assert peaks[name]["cores"] == info["environment"]["threads"]
        assert peaks[name]["flops_per_s"] == peaks[name]["per_core_flops_per_s"] * peaks[name][
            "cores"]
    one, two = peaks["test_hf_llama[1n1d]"], peaks["test_hf_llama[1n2d]"]
    assert one["per_core_flops_per_s"] == two["per_core_flops_per_s"]  # measured once
    assert one["cores"] == 2 * two["cores"]
    run.stdout.fnmatch_lines([
        f"pytest-dlperf: MFU of *test_hf_llama[[]{case}[]] against * GFLOP/s a core at fp32 x "
        f"{peaks[f'test_hf_llama[{case}]']['cores']} thread(s) a rank, a dense GEMM measured "
        "here (torch *, 1024x1024 matrices, one thread, *; not the hardware's peak)"
        for case in ("1n1d", "1n2d")])
