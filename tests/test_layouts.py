"""The layout axis on the pytest side (issue 40): how a layout is spelled and resolved on a
world size, which cases a test's layouts give and their ids, the usage errors of layouts that
cannot be read or fit no topology, the skips of layouts a workload or an adapter cannot run,
and the fingerprint that keeps one layout's baseline from judging another."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_dlperf.core.parallel import Layout, LayoutError, parse_layout
from pytest_dlperf.core.protocol import QUICK, aggregate
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.core.workload import Workload, WorkloadError, unknown_kinds

# At import, before any pytester snapshot of sys.modules: a torch imported inside a pytester
# test is unloaded at its end, and importing it again in the same process crashes.
torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("text", "world", "degrees", "ident"), [
    ("dp", 4, (4, 1, 1, 1), ""),
    ("fsdp", 2, (1, 2, 1, 1), "fsdp2"),
    ("fsdp", 1, (1, 1, 1, 1), "fsdp1"),  # FSDP's code on a mesh of one: its id says so
    ("tp2", 4, (2, 1, 2, 1), "dp2xtp2"),  # the ranks a degree leaves go to dp
    ("fsdpxtp2", 8, (1, 4, 2, 1), "fsdp4xtp2"),
    ("pp2-gpipe-mb4", 2, (1, 1, 1, 2), "pp2-gpipe-mb4"),
])
def test_a_spelling_resolves_on_a_world_size(text: str, world: int,
                                             degrees: tuple[int, int, int, int],
                                             ident: str) -> None:
    layout = parse_layout(text).resolve(world)
    assert (layout.dp, layout.fsdp, layout.tp, layout.pp) == degrees
    assert layout.world_size == world
    assert layout.id == ident
    assert Layout.from_json(layout.to_json()) == layout


def test_replicas_not_ranks_make_the_global_batch() -> None:
    fsdp_tp = parse_layout("fsdp2xtp2").resolve(4)
    # Ranks 0 and 1 are one replica's two tensor-parallel halves: one batch between them.
    assert [fsdp_tp.data_rank(rank) for rank in range(4)] == [0, 0, 1, 1]
    assert fsdp_tp.global_batch(8) == 16
    assert fsdp_tp.units_per_step(8, units_per_sample=64) == 16 * 64
    assert parse_layout("pp2").resolve(2).global_batch(8) == 8
    assert parse_layout("pp2").resolve(2).stage_microbatches == 4  # two per stage


def test_a_tensor_parallel_steps_throughput_counts_one_batch_per_replica() -> None:
    # Two ranks of one replica each timed one 2-step window of 0.5 s: 8 sequences of 64
    # tokens a step, not 16.
    ranks = [{"windows": [{"steps": 2, "elapsed_s": 0.5}], "warmup_s": 0.1} for _ in range(2)]
    tensor_parallel = aggregate(ranks, 8, 1.0, data_parallel=1, units_per_sample=64)
    assert tensor_parallel.samples_per_s == [8 * 64 * 2 / 0.5]
    assert aggregate(ranks, 8, 1.0).samples_per_s == [16 * 2 / 0.5]  # DDP: both replicas


def test_the_learning_rate_scales_with_the_replicas_global_batch() -> None:
    from pytest_dlperf.core.workload import SGD

    workload = Workload("mlp", recipes={"torch": "m:f"}, optimizer=SGD(lr_per_256=0.1))
    tensor = spec_for("torch", workload, protocol=QUICK, device_type="cpu",
                      world_size=4, batch_size=64, layout=parse_layout("tp2").resolve(4))
    plain = spec_for("torch", workload, protocol=QUICK, device_type="cpu",
                     world_size=4, batch_size=64)
    assert tensor.optimizer.lr == pytest.approx(0.1 * 128 / 256)  # 2 replicas of 64
    assert plain.optimizer.lr == pytest.approx(0.1 * 256 / 256)
    assert plain.layout is None  # plain data parallelism: the spec as before layouts
    assert tensor.parallel(4) == parse_layout("tp2").resolve(4)


@pytest.mark.parametrize(("text", "says"), [
    ("fsdp0", "at least 1"),
    ("zp2", "cannot read 'zp2'"),
    ("fsdpxtp", "more than one degree open"),
    ("tp2-gpipe", "only a pipeline term"),
    ("pp2-fast", "unknown pipeline option 'fast'"),
    ("tp2xtp2", "names tp twice"),
    ("emb2", r"an emb term takes one option, emb2-<option>, and 'emb2' has none \(a plan: "
             r"dp .*; rw \(row-wise"),
    ("emb2-tw-cw", "an emb term takes one option, emb2-<option>, and 'emb2-tw-cw' has tw, cw"),
    ("emb2-abc", "unknown emb option 'abc'"),
    # issue 74: read as 'emb2-', '', '' (x joins terms), it said only "cannot read 'emb2-'"
    ("emb2-xx", "'x' joins a layout's terms, so it was read as 'emb2-', '', '', and 'emb2-' is "
                "no term: an option cannot contain an x"),
    ("pfc2-r0", r"the sample ratio 0 is outside \(0, 1\]; a sample ratio r<ratio>"),
    ("pfc2-r1.5", r"the sample ratio 1.5 is outside \(0, 1\]"),
    ("pfc2-half", r"unknown pfc option 'half' \(a sample ratio r<ratio> in \(0, 1\]"),
    ("pfc2-r0.1-r0.2", "a pfc term takes at most 1 option, and 'pfc2-r0.1-r0.2' has r0.1, r0.2"),
])
def test_a_layout_that_cannot_be_read_says_why(text: str, says: str) -> None:
    with pytest.raises(LayoutError, match=says):
        parse_layout(text)


def test_a_head_split_names_its_sample_ratio_in_its_id() -> None:
    from pytest_dlperf.core.kinds.pfc import sample_ratio

    partial = parse_layout("pfc-r0.1").resolve(2)
    whole = parse_layout("pfc").resolve(2)
    assert (partial.id, whole.id) == ("pfc2-r0.1", "pfc2")
    assert sample_ratio(partial.options_of("pfc")) == 0.1
    assert sample_ratio(whole.options_of("pfc")) == 1.0


def test_degrees_that_do_not_divide_the_world_name_the_layout() -> None:
    with pytest.raises(LayoutError, match=r"'fsdp2xtp2' needs a multiple of 4 ranks and the "
                                          r"case has 2"):
        parse_layout("fsdp2xtp2").resolve(2)


def test_a_workload_names_its_units_and_layouts_or_is_refused() -> None:
    with pytest.raises(WorkloadError, match="units_per_sample='seq' names no size"):
        Workload("lm", recipes={"torch": "m:f"}, units_per_sample="seq")
    with pytest.raises(WorkloadError, match="unknown kind"):  # in pytest's process
        unknown_kinds(Workload("lm", recipes={"torch": "m:f"}, layouts=("dp", "zero")))
    with pytest.raises(WorkloadError, match="'dp' missing"):
        Workload("lm", recipes={"torch": "m:f"}, layouts=("fsdp",))


PERF = """
import pytest
import torch

from pytest_dlperf import Parts, Workload


def mlp(ctx):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, 16),
                 targets=torch.randint(0, 4, (ctx.batch_size,)))


MLP = Workload("mlp", recipes={"torch": mlp}, batch_size={"cpu": 8})


@pytest.mark.layouts("dp", "fsdp", "tp2")
def test_mlp(cluster, layout, throughput_meter):
    throughput_meter.measure("torch", MLP)
"""


def test_a_tests_layouts_give_one_case_per_topology_they_divide(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_models=PERF)
    collected = pytester.runpytest("--collect-only", "-q", "--devices-per-node", "2")
    collected.stdout.fnmatch_lines([
        "test_models.py::test_mlp[[]1n1d[]]", "test_models.py::test_mlp[[]1n2d[]]",
        "test_models.py::test_mlp[[]1n1d-fsdp1[]]", "test_models.py::test_mlp[[]1n2d-fsdp2[]]",
        "test_models.py::test_mlp[[]1n2d-tp2[]]", "5 tests collected*"])
    # The option overrides the marker.
    chosen = pytester.runpytest("--collect-only", "-q", "--devices-per-node", "2",
                                "--dlperf-layouts", "pp")
    chosen.stdout.fnmatch_lines(["test_models.py::test_mlp[[]1n1d-pp1[]]",
                                 "test_models.py::test_mlp[[]1n2d-pp2[]]", "2 tests collected*"])


@pytest.mark.parametrize(("args", "marker", "says"), [
    (("--dlperf-layouts", "fsdp3"), "", "*test_mlp: layout 'fsdp3' divides none of this test's "
     "topologies' ranks (1n1d (1), 1n2d (2))*"),
    (("--dlperf-layouts", "dp,zz"), "", "*--dlperf-layouts*cannot read 'zz'*"),
    ((), '@pytest.mark.layouts("fsdp", "tp2-gpipe")',
     "*test_mlp: @pytest.mark.layouts: layout 'tp2-gpipe': only a pipeline term*"),
    ((), "@pytest.mark.layouts(2)", "*takes layouts as strings*"),
])
def test_a_layout_that_cannot_run_anywhere_is_a_usage_error(
        pytester: pytest.Pytester, args: tuple[str, ...], marker: str, says: str) -> None:
    text = PERF if not marker else PERF.replace('@pytest.mark.layouts("dp", "fsdp", "tp2")',
                                                marker)
    pytester.makepyfile(test_models=text)
    # Not --collect-only: a run that was to measure, refused before it did (issue 74: the
    # refusal left an empty results file behind)
    result = pytester.runpytest("-q", "--devices-per-node", "2", "--dlperf-json", "out.json",
                                *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([says])
    assert not (pytester.path / "out.json").exists()


def test_a_layout_the_workload_or_adapter_cannot_run_skips_saying_why(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_models=PERF)
    # The MLP's workload has no tensor-parallel plan: nothing launches.
    result = pytester.runpytest("-q", "--devices-per-node", "2", "-rs", "-k", "tp2",
                                "--dlperf-protocol", "quick")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*workload 'mlp' does not support tp (layout tp2; its "
                                 "layouts: dp, fsdp)*Workload(layouts=...)*"])


def test_a_tests_own_parameter_called_layout_is_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_models=PERF + '''

@pytest.mark.parametrize("layout", ["grid", "flex"])
def test_css(layout):
    assert layout in ("grid", "flex")


@pytest.mark.parametrize(("layout", "size"), [("dp", 1)])
def test_own_axis(cluster, layout, size):
    assert layout == "dp"
''')
    result = pytester.runpytest("-q", "--devices-per-node", "2", "-k", "css or own_axis")
    result.assert_outcomes(passed=4)  # grid, flex; dp on 1n1d and 1n2d


def test_a_four_rank_layout_runs_on_two_cores_only_when_oversubscribing(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object]) -> None:
    fake_hardware(cpu_count=2)
    pytester.makepyfile(test_models=PERF)
    args = ("--collect-only", "-q", "--devices-per-node", "4", "--dlperf-layouts", "fsdp2xtp2")
    refused = pytester.runpytest(*args)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--devices-per-node=4, but this host has 2 usable CPU cores*"])
    allowed = pytester.runpytest(*args, "--dlperf-oversubscribe")
    allowed.stdout.fnmatch_lines(["test_models.py::test_mlp[[]1n4d-fsdp2xtp2[]]",
                                  "1 test collected*"])
