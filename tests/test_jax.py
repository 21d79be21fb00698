"""The JAX adapter's cases under pytest: an own model on two nodes, dp and fsdp, and the
compiled cases a JAX module gets by default. The contract every adapter meets (two ranks average
under dp and fsdp, a window waits for JAX's asynchronous dispatch) is tests/test_conformance.py's.

JAX runs under its own interpreter (``scripts/setup-jax``, or ``DLPERF_TEST_JAX_PYTHON``): every
JAX line here runs in a subprocess under it, and the tests skip without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

RECIPES = """
from pytest_dlperf import Parts


def build(ctx):
    import jax  # inside the recipe: the pytest side never imports JAX
    from flax import nnx

    width = int(ctx.sizes["width"])
    rngs = nnx.Rngs(ctx.seed)
    model = nnx.Sequential(nnx.Linear(width, 2 * width, dtype=ctx.amp_dtype, rngs=rngs),
                           nnx.relu,
                           nnx.Linear(2 * width, 10, dtype=ctx.amp_dtype, rngs=rngs))
    keys = iter(jax.random.split(jax.random.key(ctx.seed + ctx.rank), 100_000))
    inputs = jax.random.normal(next(keys), (ctx.batch_size, width))
    return Parts(model=model, inputs=inputs,
                 targets=lambda: jax.random.randint(next(keys), (ctx.batch_size,), 0, 10))
"""

OWN_MODEL = """
import pytest

from pytest_dlperf import Workload

MLP = Workload("jax-mlp", recipes={"jax": "jax_recipes:build"}, batch_size={"cpu": 16},
               sizes={"width": 32}, unit="rows")


@pytest.mark.multinode
@pytest.mark.layouts("dp", "fsdp")
def test_mlp(cluster, layout, amp, compiler, throughput_meter):
    report = throughput_meter.measure("jax", MLP)
    assert report.environment["data_parallel_ranks"] == cluster.world_size
    assert report.environment["parameters"] == 32 * 64 + 64 + 64 * 10 + 10
"""


@pytest.mark.outside_ci("~2 minutes, beyond JAX's CI share: the two-rank averages cross ranks under both "
                        "layouts in CI, and the GPT case records and judges fsdp on two ranks")
@pytest.mark.usefixtures("subprocess_env")
def test_an_own_model_trains_on_two_nodes(pytester: pytest.Pytester, jax_python: str) -> None:
    """Two local nodes (as root, two network hosts: the gradients, and under fsdp the
    parameters' shards, cross the link), data-parallel and FSDP-sharded, fp32 and bf16 AMP,
    compiled; the eager cases skip saying why. The recipe lives in a module of its own: JAX's
    interpreter has no pytest to import the test file with."""
    pytester.makepyfile(test_own=OWN_MODEL, jax_recipes=RECIPES)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-protocol", "quick", "-m", "multinode", "--nodes",
        "2", "--devices-per-node", "1", "--dlperf-compilers", "eager,compiled", "-k", "2n1d",
        "--dlperf-precisions", "fp32,amp", "--dlperf-json", "r.json", "--dlperf-launches", "1",
        "--dlperf-unstable-cv", "50", "--dlperf-python", f"jax={jax_python}", "-rs",
        timeout=500)
    result.assert_outcomes(passed=4, skipped=4)
    result.stdout.fnmatch_lines(["*jax has no eager mode to measure: JAX trains under jax.jit*"])
    benches = json.loads((pytester.path / "r.json").read_text())["benchmarks"]
    assert sorted(b["name"] for b in benches) == [
        "test_mlp[2n1d-amp-compiled]", "test_mlp[2n1d-fp32-compiled]",
        "test_mlp[2n1d-fsdp2-amp-compiled]", "test_mlp[2n1d-fsdp2-fp32-compiled]"]
    for bench in benches:
        info = bench["extra_info"]
        assert info["samples_per_s"] > 0
        from pytest_dlperf.launch import fabric

        if fabric.available()[0]:
            assert len(set(info["network"]["addresses"])) == 2, info["network"]


def test_a_jax_module_gets_its_compiled_cases_by_default(pytester: pytest.Pytester,
                                                         jax_python: str) -> None:
    """CPU's default compiler axis is eager, which JAX has not: a module whose FRAMEWORK is
    "jax" gets its compiled cases instead of cases that would all skip; another framework's
    module keeps eager, and --dlperf-compilers, when given, rules every module: a JAX eager
    case then skips, saying why, before anything is launched."""
    body = ("\ndef test_x(cluster, compiler, throughput_meter):\n"
            "    throughput_meter.measure(FRAMEWORK, 'gpt')\n")
    pytester.makepyfile(test_j='FRAMEWORK = "jax"\n' + body, test_t='FRAMEWORK = "torch"\n' + body,
                        test_none='FRAMEWORK = None\n' + body)
    default = pytester.runpytest("--co", "-q", "-p", "no:cacheprovider")
    default.stdout.fnmatch_lines_random(["test_j.py::test_x[[]1n1d-compiled[]]",
                                         "test_t.py::test_x[[]1n1d-eager[]]",
                                         "test_none.py::test_x[[]1n1d-eager[]]"])
    default.stdout.no_fnmatch_line("test_j.py::test_x[[]1n1d-eager[]]")
    given = pytester.runpytest("-p", "no:cacheprovider", "--dlperf-compilers", "eager", "-rs",
                               "--dlperf-python", f"jax={jax_python}", "test_j.py", "-k", "1n1d")
    given.assert_outcomes(skipped=1)
    given.stdout.fnmatch_lines(["SKIPPED [[]1[]] *jax has no eager mode to measure: JAX trains "
                                "under jax.jit*--dlperf-compilers compiled*"])
