"""Issue 16 for TensorFlow, OneFlow, Paddle, MindSpore, MXNet and JAX, through the plugin with real ranks
on CPU: --dlperf-batch-size max searches under a memory limit the OS enforces, each probe a fresh
launch of that framework, and the case is measured at the batch found (test_memory_cases.py does
the same, and more, for torch)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

# A module of its own, with no pytest in it: OneFlow's ranks run under a Python without pytest.
RECIPES = """
from pytest_dlperf import Parts, Workload

# Each sample keeps ~30-50 MiB for backward (its 1024 features tiled 4096 times, then ReLU):
# memory grows with the batch in steps far larger than a process's own jitter.


def tf_wide(ctx):
    import keras
    import tensorflow as tf

    inputs = keras.Input((1024,))
    h = keras.layers.Dense(1024)(inputs)
    h = keras.ops.tile(keras.ops.expand_dims(h, -1), [1, 1, 4096])
    outputs = keras.layers.Dense(10)(keras.ops.mean(keras.ops.relu(h), -1))
    return Parts(model=keras.Model(inputs, outputs),
                 inputs=tf.random.normal((ctx.batch_size, 1024)),
                 targets=lambda: tf.random.uniform((ctx.batch_size,), 0, 10, tf.int32))


def of_wide(ctx):
    import oneflow as flow

    class Wide(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = flow.nn.Linear(1024, 1024)
            self.head = flow.nn.Linear(1024, 10)

        def forward(self, x):
            h = self.proj(x).unsqueeze(-1).repeat(1, 1, 4096)
            return self.head(flow.relu(h).mean(-1))

    return Parts(model=Wide(), inputs=flow.randn(ctx.batch_size, 1024),
                 targets=lambda: flow.randint(0, 10, (ctx.batch_size,)))


def pd_wide(ctx):
    import paddle

    class Wide(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.proj = paddle.nn.Linear(1024, 1024)
            self.head = paddle.nn.Linear(1024, 10)

        def forward(self, x):
            h = self.proj(x).unsqueeze(-1).tile([1, 1, 4096])
            return self.head(paddle.nn.functional.relu(h).mean(-1))

    return Parts(model=Wide(), inputs=paddle.randn([ctx.batch_size, 1024]),
                 targets=lambda: paddle.randint(0, 10, [ctx.batch_size]))


def ms_wide(ctx):
    import mindspore as ms

    class Wide(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.proj = ms.nn.Dense(1024, 1024)
            self.head = ms.nn.Dense(1024, 10)

        def construct(self, x):
            h = ms.ops.tile(self.proj(x).expand_dims(-1), (1, 1, 4096))
            return self.head(ms.ops.relu(h).mean(-1))

    return Parts(model=Wide(), inputs=ms.ops.randn(ctx.batch_size, 1024),
                 targets=lambda: ms.ops.randint(0, 10, (ctx.batch_size,), dtype=ms.int32))


def mx_wide(ctx):
    import mxnet as mx

    class Wide(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.proj = mx.gluon.nn.Dense(1024, in_units=1024)
                self.head = mx.gluon.nn.Dense(10, in_units=1024)

        def hybrid_forward(self, F, x):
            h = F.tile(F.expand_dims(self.proj(x), -1), (1, 1, 4096))
            return self.head(F.relu(h).mean(-1))

    model = Wide()
    model.initialize(mx.init.Xavier())
    return Parts(model=model, inputs=mx.nd.random.normal(shape=(ctx.batch_size, 1024)),
                 targets=lambda: mx.nd.random.randint(0, 10, (ctx.batch_size,)))


def jx_wide(ctx):
    # XLA would fuse a tile, its ReLU and the mean into one reduction that keeps nothing: a
    # convolution's output is kept for backward instead (16 MiB a sample at 256x256x64, and its
    # gradient as much). With 32 channels a launch's own jitter moved the edge by one (batch
    # 12 fitted as a probe, not when measured); with 64, three searches found 5 each.
    import jax
    from flax import nnx

    class Wide(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(3, 64, (3, 3), rngs=rngs)
            self.head = nnx.Linear(64, 10, rngs=rngs)

        def __call__(self, x):
            return self.head(nnx.relu(self.conv(x)).mean((1, 2)))

    keys = iter(jax.random.split(jax.random.key(ctx.seed), 100_000))
    return Parts(model=Wide(nnx.Rngs(ctx.seed)),
                 inputs=jax.random.normal(next(keys), (ctx.batch_size, 256, 256, 3)),
                 targets=lambda: jax.random.randint(next(keys), (ctx.batch_size,), 0, 10))


WIDE = Workload("wide", recipes={"tensorflow": tf_wide, "oneflow": of_wide, "paddle": pd_wide,
                                 "mindspore": ms_wide, "mxnet": mx_wide, "jax": jx_wide},
                batch_size={"cpu": 8})
"""

TESTS = """
import pytest

from wide_recipes import WIDE


@pytest.mark.parametrize("framework",
                         ["tensorflow", "oneflow", "paddle", "mindspore", "mxnet", "jax"])
def test_wide(framework, throughput_meter):
    throughput_meter.measure(framework, WIDE)
"""


@pytest.fixture
def framework_args(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """What the child run needs for this framework; skips where it is not installed."""
    framework = request.param
    if framework in ("oneflow", "mindspore", "mxnet", "jax"):
        python = request.getfixturevalue(f"{framework}_python")
        return ("--dlperf-python", f"{framework}={python}")
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed in pytest's interpreter (scripts/setup)")
    return ()


@pytest.mark.usefixtures("subprocess_env")
@pytest.mark.parametrize("framework_args",
                         ["tensorflow", "oneflow", "paddle",
                          pytest.param("mindspore", marks=pytest.mark.outside_ci(
                              "11 s, beyond MindSpore's CI share")),
                          pytest.param("mxnet", marks=pytest.mark.outside_ci("13 s, beyond MXNet's CI share")),
                          "jax"],
                         indirect=True)
def test_batch_size_max_searches_each_frameworks_own_memory(
        pytester: pytest.Pytester, framework_args: tuple[str, ...],
        request: pytest.FixtureRequest) -> None:
    framework = request.node.callspec.id
    pytester.makepyfile(wide_recipes=RECIPES, test_w=TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--devices-per-node", "1", "-k", framework, *framework_args,
        "--dlperf-warmup-steps", "2", "--dlperf-steps", "2", "--dlperf-repeats", "1",
        "--dlperf-max-repeats", "1", "--dlperf-launches", "1", "--dlperf-unstable-cv", "10",
        "--dlperf-baselines", "bl", "--dlperf-batch-size", "max",
        "--dlperf-memory-limit", "512M", "--dlperf-json", "r.json", timeout=400)
    result.assert_outcomes(passed=1)
    (bench,) = json.loads(Path(pytester.path / "r.json").read_text())["benchmarks"]
    info = bench["extra_info"]
    assert info["fingerprint"]["framework"] == framework
    assert info["fingerprint"]["batch_size"] == "max"
    searched = info["batch_search"]
    found = searched["found"]
    assert info["batch_size"] == found
    # The edge, each side a fresh launch of this framework's ranks: the found batch trained,
    # one more was ended for lack of memory (the cgroup's OOM killer, or the framework's own
    # error under an address-space limit), and was reported as such: by its probe, or by the
    # measurement at it after its probe fitted (a batch at the edge does not fit every time:
    # the search steps one down, core.batchsearch's retreat; TensorFlow's did in CI).
    probes = {p["batch"]: p for p in searched["probes"] if p["stage"] == "probe"}
    over = [p for p in searched["probes"] if p["batch"] == found + 1 and not p["fits"]]
    assert over, searched
    assert f"ran out of memory at batch {found + 1}" in over[0]["message"]
    if over[0]["stage"] == "probe":
        assert probes[found]["fits"]
    else:  # a retreat: the measurement ran out where a probe had fitted
        assert over[0]["stage"] == "measurement" and probes[found + 1]["fits"]
    assert 2 <= found < 30, "512 MiB should bound this workload within a few dozen"
    assert info["peak_memory_bytes"] > 0 and info["samples_per_s"] > 0
    result.stdout.fnmatch_lines([f"*test_wide*{framework}*max={found}*"])
