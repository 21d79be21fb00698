"""The JAX adapter: ranks from the plugin's launchers in JAX's distributed runtime (the
coordinator at the launcher's spare port), one compiled step over the ranks' devices whose update
is DDP's under the dp and the fsdp layouts, and windows that wait for JAX's asynchronous
dispatch.

JAX runs under its own interpreter (``scripts/setup-jax``, or ``DLPERF_TEST_JAX_PYTHON``): every
JAX line here runs in a subprocess under it, and the tests skip without it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from snippets import WINDOW_AGAINST_A_CLOCK, free_ports, run_snippet, run_together

REPO = Path(__file__).resolve().parents[1]

STEP = """
import json, sys
sys.path.insert(0, "tests")
from pytest_dlperf import SGD, Workload
from pytest_dlperf.frameworks import DistEnv, load
from pytest_dlperf.core.parallel import Layout
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.core.recipes import load_recipe
workload = Workload("linear", recipes={"jax": "optimizer_recipes:jax_random"},
                    batch_size={"cpu": 4}, sizes={"data_rank": RANK},
                    optimizer=SGD(lr_per_256=0.1 * 256 / 4, momentum=0.0))
layout = Layout(fsdp=WORLD, named=("fsdp",)) if LAYOUT == "fsdp" else Layout(dp=WORLD)
spec = spec_for("jax", workload, protocol=QUICK, device_type="cpu", compiler="compiled",
                world_size=WORLD, layout=layout)
from dataclasses import replace
spec = spec.with_(optimizer=replace(spec.optimizer, lr=0.1))  # whatever the global batch
dist = DistEnv(RANK, WORLD, RANK, WORLD, 0)
trainer = load("jax").build_trainer(spec, dist, load_recipe(spec.recipe))
from jax.experimental import multihost_utils
def weights():  # every parameter whole, on every rank, the weight first
    whole = [multihost_utils.process_allgather(p, tiled=True) for p in trainer.params]
    return [a.tolist() for a in sorted(whole, key=lambda a: -a.ndim)]
shards = [list(p.addressable_data(0).shape) for p in trainer.params]
before = weights()
trainer.step()
trainer.synchronize()
after = weights()
env = trainer.environment()
trainer.close()
print(json.dumps({"before": before, "after": after, "ranks": env["data_parallel_ranks"],
                  "devices": env["devices"], "shards": sorted(shards)}))
"""


def _flat(weights: list[Any]) -> list[float]:
    out: list[float] = []
    for value in weights:
        out.extend(_flat(value) if isinstance(value, list) else [float(value)])
    return out


@pytest.mark.parametrize("layout", ["dp", "fsdp"])
def test_two_ranks_average_their_gradients(layout: str, jax_python: str) -> None:
    """Two ranks through the adapter (JAX's distributed runtime from the launcher's variables,
    the coordinator on the spare port), each on its own data: one step of plain SGD leaves both
    with the same weights, the mean of what each rank's data alone gives (summed gradients would
    give twice the update, a rank alone its own). Under fsdp each rank holds half of every
    parameter."""
    ports = free_ports(2)
    head = f"LAYOUT = {layout!r}\n"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports[0]),
           "DLPERF_FRAMEWORK_PORT": str(ports[1])}
    together: list[Any] = run_together(
        jax_python, [head + f"RANK, WORLD = {rank}, 2\n" + STEP for rank in (0, 1)], env)
    alone: list[Any] = [run_snippet(jax_python, head + f"RANK, WORLD = {rank}, 1\n" + STEP)
                        for rank in (0, 1)]
    assert [(r["ranks"], r["devices"]) for r in together] == [(2, 2), (2, 2)]
    # The weight (4 x 8 as torch's, Flax's kernel 8 x 4) and the bias (4).
    assert together[0]["shards"] == ([[2], [4, 4]] if layout == "fsdp" else [[4], [8, 4]])
    assert together[0]["before"] == together[1]["before"] == alone[0]["before"]
    first, second = (_flat(r["after"]) for r in together)
    assert first == pytest.approx(second, abs=1e-7)
    each = [_flat(r["after"]) for r in alone]
    assert each[0] != pytest.approx(each[1], abs=1e-4)  # the ranks' data differ
    assert first == pytest.approx([(a + b) / 2 for a, b in zip(*each)], abs=1e-6)


def test_a_window_waits_for_jax(jax_python: str) -> None:
    """A JAX step returns once it is dispatched, on CPU too: the meter's window agrees with a
    wall clock read after a blocking loss fetch, and with a no-op synchronize it reads under
    half of that clock (the control: the check can fail). A small ResNet-50 step."""
    figures = run_snippet(jax_python, "STEPS = 3\n" + """
from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.models import RESNET50
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.rank.worker import build
spec = spec_for("jax", RESNET50, protocol=QUICK, device_type="cpu", compiler="compiled",
                sizes={"image_size": 32})
trainer = build(spec, DistEnv(0, 1, 0, 1, 0))
for _ in range(2):
    trainer.step()
""" + WINDOW_AGAINST_A_CLOCK, timeout=600)
    assert isinstance(figures, dict)
    window, outside = figures["synchronized"]
    assert 0.9 * outside <= window <= outside
    unsynced_window, unsynced_outside = figures["not synchronized"]
    assert unsynced_window < 0.5 * unsynced_outside


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
