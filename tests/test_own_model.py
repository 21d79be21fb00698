"""Users' own models: the README's example run as it stands, recipes the ranks cannot import
refused before launch, an input pipeline as data, and pytest's own ids for parametrized cases.
Real torch training on CPU ranks (gloo), in subprocess pytest runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_dlperf.core.recipes import recipe_reference
from pytest_dlperf.core.workload import CaseWorkload, Workload, WorkloadError
from pytest_dlperf.plugin.settings import default_machine

# Those that record then judge timings run alone; so does the sharded example, which records
# with any spread (--dlperf-unstable-cv 100) and judges nothing, but whose 1n2d case's recording
# refuses a scaling efficiency above 150% (issue 52): under CI's first pass's
# OMP_WAIT_POLICY=PASSIVE (each op waking a sleeping thread), with another job on the machine,
# its 1n1d rank's two threads ran this small model 3x slower than two one-thread ranks each
# (2026-12-06; not measured on a quiet machine), and the case failed. The others share the
# machine: a run that records nothing only warns of such an efficiency, and their outcomes and
# figures do not hang on timings (the parametrized ids' speedup is read as the quotient of the
# figures it reports).
ALONE = pytest.mark.alone("it records then judges timings on one and two ranks")

# At import, before any pytester snapshot of sys.modules: a torch imported inside a pytester
# test is unloaded at its end, and importing it again in the same process crashes.
torch = pytest.importorskip("torch")

README = Path(__file__).resolve().parents[1] / "README.md"
QUICK = ["-p", "no:cacheprovider", "--dlperf-protocol", "quick", "--dlperf-unstable-cv", "10",
         "--dlperf-precisions", "fp32,amp"]


def readme_example() -> str:
    """The first Python block of the README's "Your own model" section."""
    text = README.read_text()
    section = text[text.index("\n## Your own model\n"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python block in the README's 'Your own model' section"
    return match.group(1)


def benches(path: Path) -> dict[str, dict[str, object]]:
    data = json.loads(path.read_text())
    return {b["name"]: b["extra_info"] for b in data["benchmarks"]}


@ALONE
@pytest.mark.usefixtures("subprocess_env")
def test_the_readme_example_records_then_compares_on_one_and_two_ranks(
        pytester: pytest.Pytester) -> None:
    (pytester.path / "test_my_model.py").write_text(readme_example())
    # 30 steps a window: this MLP's step takes ~2 ms here, and 10-step windows are mostly noise.
    run = (*QUICK, "--dlperf-steps", "30", "--devices-per-node", "2")
    first = pytester.runpytest_subprocess(*run, "--dlperf-update-baselines",
                                          "--dlperf-json", "1.json", timeout=600)
    first.assert_outcomes(passed=4)
    recorded = benches(pytester.path / "1.json")
    assert sorted(recorded) == ["test_mlp[1n1d-amp]", "test_mlp[1n1d-fp32]",
                                "test_mlp[1n2d-amp]", "test_mlp[1n2d-fp32]"]
    for info in recorded.values():
        assert info["unit"] == "samples" and info["sizes"] == {"width": 256}
        assert info["model"] == "mlp" and info["batch_size"] == 128
        fp = info["fingerprint"]
        assert (fp["model"], fp["width"], fp["batch_size"]) == ("mlp", 256, 128)
        assert "image_size" not in fp
        # The ranks' heap by default: glibc with fixed thresholds, whose steps take no fresh
        # pages (glibc as it comes took ~1,300 a step of a model this size).
        assert fp["allocator"] == "glibc mmap=32M trim=64M"
        assert info["environment"]["allocator_in_effect"]["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20)
        faults = [f for launch in info["page_faults_per_step_launches"] for f in launch]
        assert len(faults) == len(info["samples_per_s_repeats"]) and max(faults) < 50, faults
    stored = sorted(p.relative_to(pytester.path).parent.as_posix()
                    for p in (pytester.path / "baselines").rglob("*.json"))
    assert stored == [f"baselines/{default_machine()}/test_my_model/test_mlp-{case}"
                      for case in ("1n1d-amp", "1n1d-fp32", "1n2d-amp", "1n2d-fp32")]
    first.stdout.fnmatch_lines(["*test_mlp[[]1n2d-fp32[]]*1 x 2*fp32*128*samples/s*recorded*"])

    # The second run judges every case against those files. Whether this shared machine ran as
    # fast both times is not what is tested here (a regression verdict is a correct outcome of
    # a slower second run; the verdict's own tests cover when it should be one).
    # fp32 only: the AMP cases take the same path (bf16 is emulated, so slow, on CPUs without it).
    # No extra launches for an inconclusive verdict (--dlperf-max-repeats = repeats): up to four
    # more launches, and the outcome is not what is checked.
    second = pytester.runpytest_subprocess(*run, "-k", "fp32", "--dlperf-json", "2.json",
                                           "--dlperf-max-repeats", "5", timeout=600)
    judged = benches(pytester.path / "2.json")
    assert sorted(judged) == ["test_mlp[1n1d-fp32]", "test_mlp[1n2d-fp32]"]
    for name, info in judged.items():
        verdict = info["verdict"]
        assert verdict["outcome"] in ("pass", "improvement", "inconclusive", "regression"), name
        assert verdict["baseline"] == pytest.approx(recorded[name]["samples_per_s"])
        assert info["baseline_update"] is None
    # A case fails on a throughput, scaling-efficiency or memory regression, any a correct
    # outcome of a second run here.
    regressions = sum(info["verdict"]["outcome"] == "regression"
                      or (info["efficiency_verdict"] or {}).get("outcome") == "regression"
                      or (info["memory_verdict"] or {}).get("outcome") == "regression"
                      for info in judged.values())
    second.assert_outcomes(passed=2 - regressions, failed=regressions)


def sharded_example() -> str:
    """The Python block of docs/own-model.md's "A sharded model" section."""
    text = (README.parent / "docs" / "own-model.md").read_text()
    section = text[text.index("\n## A sharded model: FSDP and tensor parallel\n"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python block in own-model.md's 'A sharded model' section"
    return match.group(1)


# Beside other tests (scripts/test's first pass): it records (windows 100% apart allowed) and
# judges no timing; alone, a quarter of its 54 s was one core idle (2026-12-08).
@pytest.mark.usefixtures("subprocess_env")
def test_the_docs_sharded_example_trains_data_parallel_fsdp2_and_tensor_parallel(
        pytester: pytest.Pytester) -> None:
    """Issue 40: a user's own language model under FSDP2 and tensor parallel, as the docs give
    it: the recipe returns the whole model and a tensor-parallel plan, the adapter shards it,
    throughput is in tokens/s, and each layout's baseline is its own."""
    (pytester.path / "test_my_lm.py").write_text(sharded_example())
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-protocol", "quick", "--dlperf-launches", "1",
        "--dlperf-unstable-cv", "100", "--devices-per-node", "2", "--dlperf-update-baselines",
        "--dlperf-json", "r.json", timeout=600)
    result.assert_outcomes(passed=6)
    cases = benches(pytester.path / "r.json")
    assert sorted(cases) == sorted(f"test_lm[{c}]" for c in ("1n1d", "1n1d-fsdp1", "1n1d-tp1",
                                                             "1n2d", "1n2d-fsdp2", "1n2d-tp2"))
    sequence = 32
    for name, info in cases.items():
        assert info["unit"] == "tokens" and info["units_per_sample"] == sequence, name
        # tokens a step: 4 sequences per replica; tensor-parallel ranks share one replica's.
        replicas = 1 if "tp" in name or "1n1d" in name else 2
        assert info["global_batch"] == 4 * replicas * sequence, name
        assert info["fingerprint"].get("layout") == (name[8:-1].split("-", 1)[1]
                                                     if "-" in name else None), name
    # The plain data-parallel cases' fingerprints have no layout: as before layouts existed.
    files = {p.parent.name: json.loads(p.read_text())["fingerprint"]
             for p in (pytester.path / "baselines").rglob("*.json")}
    assert sorted(files) == sorted(f"test_lm-{name[8:-1]}" for name in cases)
    assert "layout" not in files["test_lm-1n2d"] and files["test_lm-1n2d-tp2"]["layout"] == "tp2"
    result.stdout.fnmatch_lines(["*test_lm[[]1n2d-fsdp2[]]*1 x 2*tokens/s*recorded*"])
    # Issue 52: the FLOP count took the default loss on the sequence's logits ("Expected target
    # size [1, 512], got [1, 64]"), so MFU was missing without a word; the count uses the
    # trainer's loss, and each case's MFU is taken against the CPU's measured GEMM rate (issue
    # 74), said under the table.
    for name, info in cases.items():
        assert info["flops_problem"] is None and info["flops_per_sample"] > 0, name
        assert info["mfu"] > 0, name
    result.stdout.fnmatch_lines(["pytest-dlperf: MFU of test_my_lm.py::test_lm[[]*against *"
                                 "a dense GEMM measured here*"])
    # What the tensor-parallel plan sharded (the embedding and the head stay whole), and FSDP's
    # units.
    sharded = {name: info["environment"].get("sharded_modules") for name, info in cases.items()}
    assert sharded["test_lm[1n2d-tp2]"] == {"tp": sorted(
        f"layers.{i}.{m}" for i in range(2) for m in ("q", "k", "v", "o", "up", "down"))}
    assert sharded["test_lm[1n2d-fsdp2]"] == {"fsdp": ["layers.0", "layers.1", "(root)"]}
    assert sharded["test_lm[1n2d]"] is None


@ALONE
@pytest.mark.usefixtures("subprocess_env")
def test_the_readme_examples_first_recording_run_records_as_a_new_user_runs_it(
        pytester: pytest.Pytester) -> None:
    """Issue 39: a new user's first `pytest --dlperf-update-baselines` of the README's file, on
    an idle 2-core VM, ended "2 failed, 2 passed": launch 1 read ~50% faster than launches 2-3,
    and the windows' spread over all launches (20.8%) was above --dlperf-unstable-cv. Launches
    apart are the machine's drift, which the verdict models; only windows apart within a launch
    refuse a baseline. Run as the README says, default protocol and options (fp32: the AMP
    cases take the same path)."""
    (pytester.path / "test_my_model.py").write_text(readme_example())
    first = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dlperf-precisions",
                                          "fp32", "--dlperf-launches", "3",  # the default's
                                          "--dlperf-update-baselines", "--dlperf-json",
                                          "1.json", timeout=900)
    first.assert_outcomes(passed=2)
    recorded = benches(pytester.path / "1.json")
    assert sorted(recorded) == ["test_mlp[1n1d-fp32]", "test_mlp[1n2d-fp32]"]
    for name, info in recorded.items():
        assert info["baseline_update"]["action"] == "recorded", name
        assert info["launches"] == 3 and info["repeats_measured"] == 9, name
    assert len(list((pytester.path / "baselines").rglob("*.json"))) == 2


RECIPES = """
import torch

from pytest_dlperf import Parts, Workload


def build(ctx):
    model = torch.nn.Linear(8, 4)
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, 8),
                 targets=torch.randint(0, 4, (ctx.batch_size,)))


def make_nested():
    def nested(ctx):
        return build(ctx)
    return nested


LAMBDA = Workload("tiny", recipes={"torch": lambda ctx: build(ctx)}, batch_size=4)
NESTED = Workload("tiny", recipes={"torch": make_nested()}, batch_size=4)
NO_TORCH = Workload("tiny", recipes={"tensorflow": build}, batch_size=4)


def test_lambda(throughput_meter):
    throughput_meter.measure("torch", LAMBDA)


def test_nested(throughput_meter):
    throughput_meter.measure("torch", NESTED)


def test_no_recipe(throughput_meter):
    throughput_meter.measure("torch", NO_TORCH)


def test_unknown_size(throughput_meter):
    throughput_meter.measure("torch", Workload("tiny", {"torch": build}), sizes={"widht": 3})
"""


def test_recipes_ranks_cannot_import_are_refused_before_launch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_recipes=RECIPES)
    result = pytester.runpytest("-p", "no:cacheprovider", "--devices-per-node", "1",
                                "--dlperf-timeout", "5")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines([
        "*test_lambda*a lambda cannot be a recipe: every rank imports the recipe by module and "
        "name*",
        "*test_nested*make_nested.<locals>.nested is defined inside another function, so ranks "
        "cannot import it; move it to the top level of its module*",
        "*test_no_recipe*torch has no model 'tiny': that workload has recipes for tensorflow "
        "only (built-in models with a torch recipe: bert_base, gpt, insightface, resnet50, "
        "wide_deep)*",
        "*test_unknown_size*workload 'tiny' has no size(s) widht (its sizes: none)*",
    ])
    assert "training throughput" not in result.stdout.str()  # nothing was measured


PIPELINE = """
import os
from pathlib import Path

import torch

from pytest_dlperf import Parts, Workload

DATA = Path(__file__).parent / "data"


class Files(torch.utils.data.Dataset):
    \"\"\"One sample per file, read from disk every time (the pipeline under test).\"\"\"

    def __init__(self, rank):
        self.files = sorted(DATA.glob("*.pt"))
        self.rank = rank

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        seen = DATA.parent / f"read-by-rank-{self.rank}"
        if not seen.exists():
            seen.write_text(str(os.getpid()))
        sample = torch.load(self.files[index])
        return sample["x"], sample["y"]


def build(ctx):
    loader = torch.utils.data.DataLoader(Files(ctx.rank), batch_size=ctx.batch_size,
                                         shuffle=True, drop_last=True)
    return Parts(model=torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                           torch.nn.Linear(32, 4)), data=loader)


FROM_FILES = Workload("files-mlp", recipes={"torch": build}, batch_size=4)


def test_pipeline(cluster, throughput_meter):
    report = throughput_meter.measure("torch", FROM_FILES)
    assert report.environment["data_parallel_ranks"] == cluster.world_size
"""


@pytest.mark.usefixtures("subprocess_env")
def test_an_input_pipeline_reading_files_feeds_every_rank(pytester: pytest.Pytester) -> None:
    data = pytester.mkdir("data")
    for index in range(10):  # fewer than the steps: the loader restarts at each epoch's end
        torch.save({"x": torch.randn(16), "y": torch.tensor(index % 4)}, data / f"{index}.pt")
    pytester.makepyfile(test_pipeline=PIPELINE)
    # (what is checked is each rank's reading: no 1n1d launch for a speedup)
    result = pytester.runpytest_subprocess(*QUICK, "--devices-per-node", "2", "-k", "1n2d",
                                           "--dlperf-speedup", "off", timeout=300)
    result.assert_outcomes(passed=1)
    assert sorted(p.name for p in pytester.path.glob("read-by-rank-*")) == [
        "read-by-rank-0", "read-by-rank-1"]


IDS = """
import pytest
import torch

from pytest_dlperf import Parts, Workload


class Width:
    \"\"\"An object parameter: its str() is an address, its id comes from ids=.\"\"\"

    def __init__(self, n):
        self.n = n


def build(ctx):
    width = int(ctx.sizes["width"])
    return Parts(model=torch.nn.Linear(width, 4), inputs=torch.randn(ctx.batch_size, width),
                 targets=torch.randint(0, 4, (ctx.batch_size,)))


TINY = Workload("tiny", recipes={"torch": build}, batch_size=8, sizes={"width": 4})


@pytest.mark.parametrize("width", [Width(16)], ids=["narrow"])
def test_w(cluster, width, throughput_meter):
    throughput_meter.measure("torch", TINY, sizes={"width": width.n})
"""


@pytest.mark.usefixtures("subprocess_env")
def test_parametrized_ids_come_from_pytest_and_find_the_one_device_reference(
        pytester: pytest.Pytester) -> None:
    """``ids=`` names the baseline folder, and the 2-device case takes its speedup against the
    1n1d case's recorded median, found by pytest's own id (not rebuilt from str(Width))."""
    pytester.makepyfile(test_ids=IDS)
    first = pytester.runpytest_subprocess(*QUICK, "--devices-per-node", "2", "-k", "1n1d",
                                          "--dlperf-update-baselines", timeout=300)
    first.assert_outcomes(passed=1)
    [stored] = (pytester.path / "baselines").rglob("*.json")
    assert stored.parent.relative_to(pytester.path).as_posix() == \
        f"baselines/{default_machine()}/test_ids/test_w-1n1d-narrow"
    one_device = json.loads(stored.read_text())["metrics"]["samples_per_s"]["median"]

    second = pytester.runpytest_subprocess(*QUICK, "--devices-per-node", "2", "-k", "1n2d",
                                           "--dlperf-json", "r.json", timeout=300)
    second.assert_outcomes(passed=1)
    [info] = benches(pytester.path / "r.json").values()
    assert info["case"] == "test_ids.py::test_w[1n2d-narrow]"
    assert info["speedup"] == pytest.approx(info["samples_per_s"] / one_device)
    data = json.loads((pytester.path / "r.json").read_text())
    assert data["benchmarks"][0]["param"] == "1n2d-narrow"
    assert data["benchmarks"][0]["params"]["cluster"] == "1n2d"


@pytest.mark.usefixtures("subprocess_env")
def test_speedup_off_launches_no_one_device_reference(pytester: pytest.Pytester) -> None:
    """``--dlperf-speedup off``: a 1n2d case alone in its session (no 1n1d case, no baseline)
    is measured with no 1n1d launch beside it, and reports no speedup or efficiency."""
    pytester.makepyfile(test_ids=IDS)
    run = (*QUICK, "--devices-per-node", "2", "-k", "1n2d", "--dlperf-precisions", "fp32",
           "--dlperf-launches", "1", "--dlperf-repeats", "1", "--dlperf-json", "r.json")
    off = pytester.runpytest_subprocess(*run, "--dlperf-speedup", "off", timeout=300)
    off.assert_outcomes(passed=1)
    assert not [line for line in off.outlines if "1n1d reference" in line], off.outlines
    [info] = benches(pytester.path / "r.json").values()
    assert info["topology"]["id"] == "1n2d"
    assert info["speedup"] is None and info["scaling_efficiency"] is None
    assert info["samples_per_s"] > 0


def build_for_reference(ctx: object) -> object:  # a module-level function: importable
    return None


def test_a_recipe_reference_names_module_function_and_import_root() -> None:
    ref = recipe_reference(build_for_reference, "test")
    assert ref.ref == f"{__name__}:build_for_reference"
    assert ref.path is not None and (Path(ref.path) / (__name__.replace(".", "/") + ".py")) \
        .resolve() == Path(__file__).resolve()
    with pytest.raises(WorkloadError, match="'module:function' path"):
        recipe_reference("no_colon_here", "test")


def test_batch_and_sizes_resolve_per_device_type_and_precision() -> None:
    workload = Workload("w", {"torch": "m:f"}, batch_size={"cuda": 128, "cuda/amp": 256, "cpu": 2},
                        sizes={"seq": {"cuda": 512, "cpu": 64}, "layers": 12})
    assert CaseWorkload.of(workload, "cuda", "amp") == CaseWorkload(
        "w", "samples", 256, {"seq": 512, "layers": 12})
    assert CaseWorkload.of(workload, "cuda", "fp32").batch_size == 128
    assert CaseWorkload.of(workload, "cpu", "amp", sizes={"seq": 8}) == CaseWorkload(
        "w", "samples", 2, {"seq": 8, "layers": 12})
    with pytest.raises(WorkloadError, match="batch_size has no value for cpu"):
        CaseWorkload.of(Workload("w", {"torch": "m:f"}, batch_size={"cuda": 1}), "cpu", "fp32")
    with pytest.raises(WorkloadError, match="would shadow fingerprint fields"):
        Workload("w", {"torch": "m:f"}, sizes={"nodes": 2})
    with pytest.raises(WorkloadError, match="positive integer"):
        CaseWorkload.of(workload, "cpu", "fp32", batch_size=0)


# A user's own adapter, as a top-level module beside the test file: torch's, with a mark of its
# own in the environment it reports (so the test sees it ran in the ranks).
OWN_ADAPTER = """
from pytest_dlperf.frameworks import torch as torch_adapter

DISTRIBUTION = "torch"
RECIPE_FOR = "torch"


def build_trainer(spec, dist, recipe):
    trainer = torch_adapter.build_trainer(spec, dist, recipe)
    reported = trainer.environment
    trainer.environment = lambda: {**reported(), "adapter": __name__}
    return trainer
"""

WITH_OWN_ADAPTER = """
import torch

from pytest_dlperf import Parts, Workload


def build(ctx):
    return Parts(model=torch.nn.Linear(8, 4), inputs=torch.randn(ctx.batch_size, 8),
                 targets=torch.randint(0, 4, (ctx.batch_size,)))


TINY = Workload("tiny", recipes={"torch": build}, batch_size=8)


def test_own(throughput_meter):
    report = throughput_meter.measure("fsdp_adapter", TINY)
    assert report.environment["adapter"] == "fsdp_adapter"


def test_not_an_adapter(throughput_meter):
    throughput_meter.measure("json", TINY)
"""


@pytest.mark.usefixtures("subprocess_env")
def test_an_adapter_of_your_own_may_be_a_top_level_module(pytester: pytest.Pytester) -> None:
    """``measure("fsdp_adapter")`` takes a top-level module pytest can import (here from a
    folder the ini's ``pythonpath`` names; the ranks, which pytest's sys.path does not reach,
    are told where it is); a module that is no adapter is refused saying what it lacks."""
    (pytester.mkdir("tools") / "fsdp_adapter.py").write_text(OWN_ADAPTER)
    perf = pytester.mkdir("perf")
    (perf / "test_with_adapter.py").write_text(WITH_OWN_ADAPTER)
    pytester.makeini("[pytest]\npythonpath = tools\n")
    result = pytester.runpytest_subprocess(*QUICK, "--devices-per-node", "1", str(perf),
                                           timeout=300)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_not_an_adapter*'json' is a module (*json*) but not a "
                                 "framework adapter: it defines no DISTRIBUTION or "
                                 "build_trainer*"])
