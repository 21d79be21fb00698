"""The TensorFlow adapter's model is the torch adapter's model: ResNet-50 v1.5, layer for layer
(the port contract's, tests/ports.py, checked in tests/test_ports.py); Keras's own is v1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from snippets import run_snippet

# torch before TensorFlow: importing torch (its triton import) after TensorFlow segfaults with
# tensorflow-cpu 2.21 + torch 2.14 (seen here). Workers never hold both but for a moment in
# this order (the address exchange imports torch.distributed before TensorFlow starts).
torchvision = pytest.importorskip("torchvision")
pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install "
                                         "'pytest-dlperf[tensorflow]')")


def test_keras_own_resnet50_is_v1_which_is_why_the_adapter_builds_its_own() -> None:
    import keras

    reference = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3))
    first_block = {layer.name: layer.strides for layer in reference.layers
                   if layer.name.startswith("conv3_block1_") and hasattr(layer, "strides")
                   and layer.name.endswith("_conv")}
    assert first_block["conv3_block1_1_conv"] == (2, 2)  # v1: stride on the first 1x1


XLA_CASE = """
def test_tf(cluster, amp, compiler, throughput_meter):
    report = throughput_meter.measure("tensorflow")
    assert report.environment["jit_compile"] == (compiler == "compiled")
    assert report.environment["parameters"] == 25_557_032
"""


@pytest.mark.usefixtures("subprocess_env")
def test_a_compiled_case_trains_under_xla_and_reports_compile_time_apart(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tf=XLA_CASE)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-warmup-steps", "1", "--dlperf-steps", "2",
        "--dlperf-repeats", "2", "--devices-per-node", "1", "--dlperf-compilers", "compiled",
        "-k", "fp32", "--dlperf-json", "r.json", "--dlperf-baselines", "bl",
        "--dlperf-update-baselines", "--dlperf-unstable-cv", "10", timeout=300)
    result.assert_outcomes(passed=1)
    (bench,) = json.loads((pytester.path / "r.json").read_text())["benchmarks"]
    info = bench["extra_info"]
    assert bench["name"] == "test_tf[1n1d-fp32-compiled]" and info["compiler"] == "compiled"
    assert info["fingerprint"]["compiler"] == "compiled"
    # XLA compiles in the first (untimed) step: it alone outlasts both timed windows together.
    assert info["first_step_s"] > sum(bench["stats"]["data"]) * 2
    # TensorFlow has no FLOP counter here: the reference figure of the same architecture,
    # counted from the torch recipe at this case's size (64x64: about (64/224)^2 of the 24.5
    # GFLOP an image at 224; the classifier does not shrink with the image).
    assert info["flops_source"] == "FlopCounterMode (meta)"
    assert info["flops_per_sample"] == pytest.approx(24.5e9 * (64 / 224) ** 2, rel=0.1)
    (path,) = (pytester.path / "bl").rglob("*.json")
    assert path.parent.name == "test_tf-1n1d-fp32-compiled"


@pytest.mark.usefixtures("subprocess_env")
def test_a_compiled_case_without_a_warm_up_step_is_refused(pytester: pytest.Pytester) -> None:
    """Without a warm-up step XLA's compile would land in a timed window: refused, saying
    why."""
    pytester.makepyfile(test_tf=XLA_CASE)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-warmup-steps", "0", "--devices-per-node", "1",
        "--dlperf-compilers", "compiled", "-k", "fp32", timeout=120)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*a compiled case needs at least one warm-up step*"])


OWN_MODEL = """
import keras
import tensorflow as tf

from pytest_dlperf import Parts, Workload


def build(ctx):
    width = int(ctx.sizes["width"])
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(2 * width, "relu"),
                              keras.layers.Dense(10)])
    return Parts(model=model, inputs=tf.random.normal((ctx.batch_size, width)),
                 targets=lambda: tf.random.uniform((ctx.batch_size,), 0, 10, tf.int32))


MLP = Workload("tf-mlp", recipes={"tensorflow": build}, batch_size={"cpu": 16},
               sizes={"width": 32})


def test_mlp(cluster, amp, compiler, throughput_meter):
    report = throughput_meter.measure("tensorflow", MLP)
    assert report.environment["data_parallel_ranks"] == cluster.world_size
    assert report.environment["parameters"] == 32 * 64 + 64 + 64 * 10 + 10
"""


# The own model's cases on two CPU workers, quick, results in r.json.
# (no speedup: the workers' training is checked, not one against the other; with a 1n1d launch
# of TensorFlow for each case the test took 56 s of a rehearsal's first pass, 28 s without,
# 2026-12-07)
TWO_WORKERS = ("-p", "no:cacheprovider", "--dlperf-protocol", "quick", "--devices-per-node", "2",
               "--dlperf-json", "r.json", "--dlperf-unstable-cv", "10", "--dlperf-speedup", "off")


@pytest.mark.usefixtures("subprocess_env")
def test_an_own_keras_model_trains_in_fp32_mixed_precision_and_compiled_on_two_workers(
        pytester: pytest.Pytester) -> None:
    """fp32 and Keras's mixed_bfloat16 eager, and fp32 compiled: three cases of one session
    (two sessions took 29 s and 22 s beside another job, 2026-12-06). XLA cannot compile
    MultiWorkerMirroredStrategy's all-reduce on CPU (TensorFlow 2.21: "Only compiling NCCL/auto
    collective is supported, got: ring"; with auto, "Collectives are not yet implemented for
    CPU devices when compiling with XLA"): there the adapter compiles the step around it, and
    says so."""
    pytester.makepyfile(test_own=OWN_MODEL)
    result = pytester.runpytest_subprocess(*TWO_WORKERS, "-k", "1n2d and (eager or fp32)",
                                           "--dlperf-precisions", "fp32,amp",
                                           "--dlperf-compilers", "eager,compiled", timeout=400)
    result.assert_outcomes(passed=3)
    benches = {b["name"]: b for b in json.loads((pytester.path / "r.json").read_text())[
        "benchmarks"]}
    assert sorted(benches) == ["test_mlp[1n2d-amp-eager]", "test_mlp[1n2d-fp32-compiled]",
                               "test_mlp[1n2d-fp32-eager]"]
    precisions = sorted(b["extra_info"]["precision"] for b in benches.values())
    assert precisions == ["amp(bfloat16)", "fp32", "fp32"]
    assert {b["extra_info"]["fingerprint"]["model"] for b in benches.values()} == {"tf-mlp"}
    for bench in benches.values():
        info = bench["extra_info"]
        # Each worker's own step (no all-reduce) for the straggler check, and its peak memory.
        ranks = info["peak_memory_per_rank"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert all(r["own_step_s"] > 0 and r["peak_memory_bytes"] > 0 for r in ranks)
        # No torch recipe: no FLOPs, and the reason is said.
        assert info["flops_per_sample"] is None and "no torch recipe" in info["flops_problem"]
    env = benches["test_mlp[1n2d-fp32-compiled]"]["extra_info"]["environment"]
    assert env["jit_compile"] is True and env["data_parallel_ranks"] == 2
    assert env["xla_compiles"] == "forward-backward and update, not the all-reduce"
    assert benches["test_mlp[1n2d-fp32-eager]"]["extra_info"]["environment"]["jit_compile"] is False


NO_PARAMETERS = """
import json, sys
from pytest_dlperf import Parts, Workload
from pytest_dlperf.frameworks import DistEnv, load
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.core.workload import WorkloadError
from pytest_dlperf.core.recipes import load_recipe
workload = Workload("flat", recipes={"tensorflow": "tf_flat:build"}, batch_size={"cpu": 4})
spec = spec_for("tensorflow", workload, protocol=QUICK, device_type="cpu")
try:
    load("tensorflow").build_trainer(spec, DistEnv(0, 1, 0, 1, 0), load_recipe(spec.recipe))
    print(json.dumps("built"))
except WorkloadError as exc:
    print(json.dumps(str(exc)))
"""

FLAT = """
import keras
import tensorflow as tf

from pytest_dlperf import Parts


def build(ctx):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Flatten()])
    return Parts(model=model, inputs=tf.zeros((ctx.batch_size, 8)),
                 targets=tf.zeros((ctx.batch_size,), tf.int32))
"""


def test_a_keras_model_with_no_weights_is_the_recipes_mistake(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    (tmp_path / "tf_flat.py").write_text(FLAT)
    said = run_snippet(sys.executable, f"sys_path = {str(tmp_path)!r}\n"
                       "import sys; sys.path.insert(0, sys_path)\n" + NO_PARAMETERS)
    assert said == ("the recipe tf_flat:build returned a model with no trainable parameters: "
                    "there is nothing to train or to all-reduce; return the model whose "
                    "training step you measure (its parameters require gradients)")
