"""The TensorFlow adapter's model is the torch adapter's model: ResNet-50 v1.5, layer for layer."""

from __future__ import annotations

import pytest

# torch before TensorFlow: importing torch (its triton import) after TensorFlow segfaults with
# tensorflow-cpu 2.21 + torch 2.14 (seen here). Workers never hold both but for a moment in
# this order (the address exchange imports torch.distributed before TensorFlow starts).
torchvision = pytest.importorskip("torchvision")
pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install "
                                         "'pytest-dlperf[tensorflow]')")


@pytest.fixture(scope="module")
def keras_model():  # type: ignore[no-untyped-def]
    from pytest_dlperf.models.resnet50 import resnet50_v15

    return resnet50_v15(num_classes=1000, image_size=64)


def test_same_trainable_parameter_count_as_torch(keras_model) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    trainable = sum(int(np.prod(w.shape)) for w in keras_model.trainable_weights)
    torch_model = torchvision.models.resnet50()
    assert trainable == sum(p.numel() for p in torch_model.parameters()) == 25_557_032
    # Keras counts BN moving statistics too (torch keeps them as buffers): like with like.
    assert keras_model.count_params() == 25_610_152


def test_every_layer_has_torchs_shape(keras_model) -> None:  # type: ignore[no-untyped-def]
    from pytest_dlperf.models.resnet50 import torch_named_shapes

    torch_shapes = {n: tuple(p.shape) for n, p in torchvision.models.resnet50().named_parameters()}
    keras_shapes = torch_named_shapes(keras_model)
    assert sorted(keras_shapes) == sorted(torch_shapes)
    mismatched = {n: (keras_shapes[n], s) for n, s in torch_shapes.items() if keras_shapes[n] != s}
    assert not mismatched
    # v1.5, not v1: a stage's first block strides on its 3x3 conv, its first 1x1 conv does not.
    import keras

    strides = {layer.name: layer.strides for layer in keras_model.layers
               if layer.name.startswith("layer2_0_conv") and isinstance(layer, keras.layers.Conv2D)}
    assert strides == {"layer2_0_conv1": (1, 1), "layer2_0_conv2": (2, 2), "layer2_0_conv3": (1, 1)}


def test_keras_own_resnet50_is_v1_which_is_why_the_adapter_builds_its_own() -> None:
    import keras

    reference = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3))
    first_block = {layer.name: layer.strides for layer in reference.layers
                   if layer.name.startswith("conv3_block1_") and hasattr(layer, "strides")
                   and layer.name.endswith("_conv")}
    assert first_block["conv3_block1_1_conv"] == (2, 2)  # v1: stride on the first 1x1


@pytest.mark.usefixtures("subprocess_env")
def test_a_compiled_case_trains_under_xla_and_reports_compile_time_apart(
        pytester: pytest.Pytester) -> None:
    import json

    pytester.makepyfile(test_tf="""
        def test_tf(cluster, amp, compiler, throughput_meter):
            report = throughput_meter.measure("tensorflow")
            assert report.environment["jit_compile"] == (compiler == "compiled")
            assert report.environment["parameters"] == 25_557_032
    """)
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
    # Without a warm-up step the compile would land in a window: refused, saying why.
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


def test_mlp(cluster, amp, throughput_meter):
    report = throughput_meter.measure("tensorflow", MLP)
    assert report.environment["data_parallel_ranks"] == cluster.world_size
    assert report.environment["parameters"] == 32 * 64 + 64 + 64 * 10 + 10
"""


@pytest.mark.usefixtures("subprocess_env")
def test_an_own_keras_model_trains_in_fp32_and_mixed_precision(pytester: pytest.Pytester) -> None:
    import json

    pytester.makepyfile(test_own=OWN_MODEL)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-protocol", "quick", "--devices-per-node", "2",
        "-k", "1n2d", "--dlperf-json", "r.json", "--dlperf-unstable-cv", "10",
        "--dlperf-precisions", "fp32,amp", timeout=300)
    result.assert_outcomes(passed=2)
    benches = json.loads((pytester.path / "r.json").read_text())["benchmarks"]
    precisions = sorted(b["extra_info"]["precision"] for b in benches)
    assert precisions == ["amp(bfloat16)", "fp32"]
    assert {b["extra_info"]["fingerprint"]["model"] for b in benches} == {"tf-mlp"}
    for bench in benches:
        info = bench["extra_info"]
        # Each worker's own step (no all-reduce) for the straggler check, and its peak memory.
        ranks = info["peak_memory_per_rank"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert all(r["own_step_s"] > 0 and r["peak_memory_bytes"] > 0 for r in ranks)
        # No torch recipe: no FLOPs, and the reason is said.
        assert info["flops_per_sample"] is None and "no torch recipe" in info["flops_problem"]
