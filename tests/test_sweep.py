"""Issue 55's sweep axis: a workload's size run as a case per rung (``--dlperf-sweep``,
``@pytest.mark.sweep``), each rung its own id and baseline, the rungs' latency and peak memory
per device together, the memory a unit costs fitted over them, and the first rung that runs out
of memory ending the sweep (a result, not an error) unless a baseline says it fit before. Real
ranks under a memory limit the OS enforces (the NumPy wide workload of test_memory_cases: ~16 MiB
a sample at its step's peak)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from numpy_mlp import ADAPTER
from test_memory_cases import SHORT, WIDE_ADAPTER, WORKLOADS, left_behind, limit_cgroups

from pytest_dlperf.core.sweep import (
    SweepError,
    fit,
    format_value,
    parse_ladder,
    parse_options,
    rung_id,
)

SWEPT = """

@pytest.mark.sweep(batch_size="2..64:x2")
def test_swept(cluster, sweep, throughput_meter):
    report = throughput_meter.measure("wide_adapter", WIDE)
    assert report.workload.batch_size == sweep.value
    # This rung is among the sweep's points once measure returned, after the smaller ones this
    # session ran (-k may select one rung alone).
    assert sweep.points[-1].report is report
    assert [p.value for p in sweep.points[:-1]] == [
        v for v in sweep.rungs if v < sweep.value and os.environ.get("ONE_RUNG") is None]
"""


@pytest.mark.parametrize(("raw", "rungs"), [
    ("200k..3.2M:x2", (200_000, 400_000, 800_000, 1_600_000, 3_200_000)),
    ("512..2048:+512", (512, 1024, 1536, 2048)),
    ("0.5M..2M:x2", (500_000, 1_000_000, 2_000_000)),
    ("85744,1M", (85_744, 1_000_000)),
    ("1..10:x3", (1, 3, 9)),  # up to the top, not past it
    ([16, 32], (16, 32))])
def test_ladders_read_as_written(raw: object, rungs: tuple[int, ...]) -> None:
    assert parse_ladder(raw) == rungs


@pytest.mark.parametrize(("raw", "says"), [
    ("3.2M..200k:x2", "the top (200k) is below the bottom"),
    ("1..4:x1", "must be > 1"),
    ("1..4", "a ladder reads LOW..HIGH:xFACTOR"),
    ("400k,200k", "the rungs must rise"),
    ("2.5", "not a whole count"),
    ("fast", "expected a count such as 200k"),
    ("0", "at least 1"),
    ("1..100000:+1", "at most 32")])
def test_bad_ladders_say_what_is_accepted(raw: str, says: str) -> None:
    with pytest.raises(SweepError, match=".*".join(map(_escape, says.split("*")))):
        parse_ladder(raw)


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_a_rung_id_spells_its_count_so_that_k_selects_it() -> None:
    assert [format_value(v) for v in (200_000, 3_200_000, 819_200_000, 2_322_444, 16, 10**9)] == [
        "200k", "3.2M", "819.2M", "2322444", "16", "1G"]
    assert rung_id("vocab", 1_600_000) == "vocab1.6M"
    # --dlperf-sweep given twice reaches the parser joined by a comma
    assert parse_options("vocab=200k,400k,num_classes=100k..400k:x2") == {
        "vocab": (200_000, 400_000), "num_classes": (100_000, 200_000, 400_000)}
    with pytest.raises(SweepError, match="vocab is swept twice"):
        parse_options("vocab=1,vocab=2")


def test_the_memory_a_unit_costs_is_the_slope_of_a_line_through_the_rungs() -> None:
    line = fit([(1, 10.0 + 3.0), (2, 10.0 + 6.1), (4, 10.0 + 11.9)])
    assert line is not None and line.points == 3
    assert line.per_unit == pytest.approx(2.96, abs=0.01)
    assert line.intercept == pytest.approx(10.1, abs=0.1)
    assert line.r2 is not None and line.r2 > 0.99
    assert fit([(1, 5.0)]) is None and fit([(1, 5.0), (1, 6.0)]) is None


def sweeps(path: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    return {s["case"].partition("::")[2]: s for s in json.loads(path.read_text())["dlperf_sweeps"]}


@pytest.mark.usefixtures("subprocess_env")
def test_a_sweep_stops_at_the_first_rung_that_runs_out_of_memory(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_w=WORKLOADS + SWEPT, wide_adapter=WIDE_ADAPTER,
                        numpy_mlp_adapter=ADAPTER)
    cgroups = limit_cgroups()
    run = (*SHORT, "-k", "test_swept", "-rsx", "--dlperf-launches", "1", "--devices-per-node",
           "1", "--dlperf-steps", "2", "--dlperf-repeats", "2")
    limited = ("--dlperf-memory-limit", "256M")
    # The first rungs fit under 256 MiB; one of them runs out of memory and ends the sweep: the
    # rungs above it are not run.
    first = pytester.runpytest_subprocess(*run, *limited, "--dlperf-update-baselines",
                                          "--dlperf-json", "1.json", timeout=600)
    outcomes = first.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, first.stdout.str()
    assert outcomes["xfailed"] == 1, first.stdout.str()
    fitted = outcomes["passed"]
    assert 2 <= fitted <= 4 and outcomes["skipped"] == 6 - fitted - 1
    record = sweeps(pytester.path / "1.json")["test_swept[1n1d]"]
    oom = record["out_of_memory_at"]
    assert record["size"] == "batch_size" and record["rungs"] == [2, 4, 8, 16, 32, 64]
    assert record["largest_fit"] == oom // 2 and [p["value"] for p in record["points"]] == [
        2 ** i for i in range(1, fitted + 2)]
    assert "ran out of memory" in record["points"][-1]["message"]
    # The line through the rungs that fit: ~16 MiB a sample (the trainer's widened activation
    # and its ReLU'd copy), within what the allocator and the process add.
    assert 12 * 2 ** 20 < record["memory_per_unit_bytes"] < 20 * 2 ** 20, record
    first.stdout.fnmatch_lines([
        "*pytest-dlperf: sweeps*",
        "*test_swept?1n1d?: batch_size over * of 6 rung(s)*",
        "*batch_size*throughput (samples/s)*latency/iter*peak mem/device*",
        f"*{oom}*OOM*-*OOM*",
        "*memory per batch_size unit: 1?.?? MiB a device (a line over * rungs*",
        f"*largest that fit: {oom // 2}; {oom} ran out of memory:*",
        f"*SKIPPED*batch_size={oom * 2}: batch_size={oom} ran out of memory (a sweep stops at "
        f"the first rung that does); the largest that fit: {oom // 2}*",
        f"*XFAIL*test_swept?1n1d-batch_size{oom}?*batch_size={oom} ran out of memory on 1n1d: "
        f"the sweep of batch_size ends here (the largest that fit: {oom // 2}; "
        "--dlperf-memory-limit 256.00 MiB)*"])
    # Each rung that fit has a baseline of its own, under its own id.
    stored = sorted(p.parent.name for p in (pytester.path / "bl").rglob("*.json"))
    assert stored == sorted(f"test_swept-1n1d-batch_size{2 ** i}"
                            for i in range(1, fitted + 1)), stored

    # Recorded without the limit, the rung that ran out fits: it has a baseline now...
    monkeypatch.setenv("ONE_RUNG", "1")
    roomy = pytester.runpytest_subprocess(*run, "-k", f"batch_size{oom}",
                                          "--dlperf-update-baselines", timeout=600)
    roomy.assert_outcomes(passed=1)
    # ... so under the limit again, its running out of memory is a regression, not the end.
    again = pytester.runpytest_subprocess(*run, *limited, "-k", f"batch_size{oom}",
                                          timeout=600)
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines([f"*batch_size={oom} ran out of memory on 1n1d, and it fit when "
                                "its baseline was recorded (*): a memory regression*"])
    assert left_behind(cgroups) == set()


SHARED = """

@pytest.mark.sweep(batch_size="8,16")
def test_shared(cluster, sweep, throughput_meter):
    throughput_meter.measure("wide_adapter", WIDE)
"""


def test_a_one_device_reference_that_runs_out_of_memory_leaves_the_case_without_speedup(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two ranks share each sample's memory (as sharded tables do): batch 16 fits a rank as 8
    # samples' ~128 MiB, and one device alone, the speedup's reference, runs out at 16 x 16 MiB.
    # The case is measured all the same; only its speedup is unknown.
    pytester.makepyfile(test_w=WORKLOADS + SHARED, wide_adapter=WIDE_ADAPTER,
                        numpy_mlp_adapter=ADAPTER)
    monkeypatch.setenv("SHARED_BATCH", "1")
    result = pytester.runpytest_subprocess(
        *SHORT, "-k", "test_shared and 1n2d", "--dlperf-launches", "1", "--devices-per-node",
        "2", "--dlperf-steps", "2", "--dlperf-repeats", "2", "--dlperf-memory-limit", "256M",
        "--dlperf-busy-threshold", "1", "--dlperf-json", "r.json", timeout=600)
    result.assert_outcomes(passed=2)
    cases = {b["name"]: b["extra_info"]
             for b in json.loads((pytester.path / "r.json").read_text())["benchmarks"]}
    assert cases["test_shared[1n2d-batch_size8]"]["speedup"] is not None
    assert cases["test_shared[1n2d-batch_size16]"]["speedup"] is None
    result.stdout.fnmatch_lines([
        "*test_shared?1n2d-batch_size16?: no speedup: one device alone (its 1n1d reference) "
        "ran out of memory at this size: rank 0 ran out of memory*"])


BAD_SWEEP = """
import pytest
from pytest_dlperf import Parts, Workload

W = Workload("w", recipes={"numpy": lambda ctx: None})


@pytest.mark.sweep(vocab="200k..800k:x2")
def test_marked(sweep, throughput_meter):
    pass


def test_plain(throughput_meter):
    pass
"""


@pytest.mark.parametrize(("args", "extra", "says"), [
    (("--dlperf-sweep", "vocab=200k..100k:x2"), "",
     "*bad value for --dlperf-sweep=vocab=200k..100k:x2: *the top (100k) is below the bottom*"),
    (("--dlperf-sweep", "200k"), "", "*--dlperf-sweep=200k: expected NAME=LADDER*"),
    (("--dlperf-sweep", "num_classes=1k,2k"), "",
     "*--dlperf-sweep num_classes: no collected test sweeps it (tests sweep: vocab)*"),
    ((), "\n@pytest.mark.sweep(vocab=[1], rows=[2])\ndef test_two(sweep, throughput_meter):\n"
         "    pass\n", "*test_two: @pytest.mark.sweep(...) takes one size as a keyword*"),
    ((), "\ndef test_bare(sweep, throughput_meter):\n    pass\n",
     "*test_bare takes the sweep fixture but names no size to sweep*"),
    ((), "\n@pytest.mark.sweep(vocab='1..4')\ndef test_bad(sweep, throughput_meter):\n"
         "    pass\n", "*test_bad: @pytest.mark.sweep(vocab=...): '1..4': a ladder reads*"),
    (("--dlperf-batch-size", "8"), "\n@pytest.mark.sweep(batch_size=[1, 2])\n"
     "def test_batches(sweep, throughput_meter):\n    pass\n",
     "*test_batches sweeps batch_size, and --dlperf-batch-size sets every case's batch*")],
    ids=["ladder", "no-name", "unswept", "two-sizes", "no-marker", "marker-ladder",
         "batch-twice"])
def test_a_bad_sweep_is_a_usage_error_naming_the_flag_or_the_test(
        pytester: pytest.Pytester, args: tuple[str, ...], extra: str, says: str) -> None:
    pytester.makepyfile(test_s=BAD_SWEEP + extra)
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([says])
    assert "Traceback" not in result.stderr.str()


def test_rungs_are_cases_with_ids_of_their_own(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_s=BAD_SWEEP)
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["test_s.py::test_marked[vocab200k]",
                                 "test_s.py::test_marked[vocab400k]",
                                 "test_s.py::test_marked[vocab800k]", "test_s.py::test_plain"])
    flagged = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", "-q",
                                 "--dlperf-sweep", "vocab=1M,3.2M", "-k", "vocab3.2M")
    flagged.stdout.fnmatch_lines(["test_s.py::test_marked[vocab3.2M]", "*1/3 tests collected*"])


GROWN = """

def grow(ctx):
    import numpy as np

    rng = np.random.default_rng(ctx.seed)
    width = int(ctx.sizes["width"])  # the step's peak: ~24 KiB a unit of width
    return Parts(model=rng.standard_normal((1024, width)) / 32.0,
                 inputs=rng.standard_normal((ctx.batch_size, 1024)),
                 targets=rng.integers(0, 10, ctx.batch_size))


GROW = Workload("grow", recipes={"numpy": grow}, batch_size={"cpu": 1}, sizes={"width": 1024})


def test_grow(throughput_meter):
    throughput_meter.measure("wide_adapter", GROW)
"""


@pytest.mark.usefixtures("subprocess_env")
def test_a_size_max_finds_the_largest_value_that_fits_under_a_memory_limit(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_w=WORKLOADS + GROWN, wide_adapter=WIDE_ADAPTER,
                        numpy_mlp_adapter=ADAPTER)
    run = (*SHORT, "-k", "test_grow", "--dlperf-launches", "1", "--devices-per-node", "1",
           "--dlperf-memory-limit", "256M", "--dlperf-steps", "2", "--dlperf-repeats", "1",
           "--dlperf-max-repeats", "1", "--dlperf-size", "width=max")
    first = pytester.runpytest_subprocess(*run, "--dlperf-update-baselines", "--dlperf-json",
                                          "1.json", timeout=600)
    first.assert_outcomes(passed=1)
    (bench,) = json.loads((pytester.path / "1.json").read_text())["benchmarks"]
    info = bench["extra_info"]
    searched = info["size_search"]
    found = searched["found"]
    assert info["batch_search"] is None and searched["size"] == "width"
    assert info["sizes"]["width"] == found and info["fingerprint"]["width"] == "max"
    assert 4096 < found < 16384, "256 MiB at ~24 KiB a unit of width"
    probes = {p["value"]: p for p in searched["probes"]}
    above = min(v for v, p in probes.items() if not p["fits"] and v > found)
    assert probes[found]["fits"] and above - found <= found // 64
    assert "ran out of memory" in probes[above]["message"]
    assert len(probes) <= 12  # doubled from 1024, then bisected to 1/64, not to the unit

    # A later search starts from that answer: two probes when nothing changed.
    again = pytester.runpytest_subprocess(*run, "--dlperf-json", "2.json", timeout=600)
    again.assert_outcomes(passed=1)
    (bench,) = json.loads((pytester.path / "2.json").read_text())["benchmarks"]
    second = bench["extra_info"]["size_search"]
    assert second["seeded"] and second["start"] == found
    assert [p["fits"] for p in second["probes"]] == [True, False]


@pytest.mark.parametrize(("args", "says"), [
    (("--dlperf-size", "width"), "*--dlperf-size=width: expected NAME=COUNT or NAME=max*"),
    (("--dlperf-size", "width=max", "--dlperf-size", "depth=max"),
     "*width and depth are both max: one size is searched at a time*"),
    (("--dlperf-size", "width=max", "--dlperf-batch-size", "max"),
     "*width=max beside --dlperf-batch-size max: one size is searched at a time*"),
    (("--dlperf-size", "batch_size=4", "--dlperf-batch-size", "8"),
     "*batch_size is given by --dlperf-batch-size=8 too; give it once*"),
    (("--dlperf-size", "width=wide"), "*width: expected a count such as 200k*"),
    (("--dlperf-size", "vocab=1M"), "*test_marked sweeps vocab, and --dlperf-size sets every "
                                    "case's vocab: give one of them*")],
    ids=["no-value", "two-max", "max-and-batch-max", "batch-twice", "not-a-count",
         "swept-and-set"])
def test_a_bad_size_is_a_usage_error_naming_the_flag(
        pytester: pytest.Pytester, args: tuple[str, ...], says: str) -> None:
    pytester.makepyfile(test_s=BAD_SWEEP)
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([says])


def test_an_out_of_memory_traceback_is_said_by_its_exception_line() -> None:
    from pytest_dlperf.launch.base import LaunchError
    from pytest_dlperf.plugin.launches import _first_line

    # What a rank's Python-side OOM handed back (torch's allocator raising in a sharded step):
    # the sweep's summary read "3.2M ran out of memory: Traceback (most recent call last):".
    raised = ("rank 1 ran out of memory at batch 512 (per device): Traceback (most recent call "
              "last):\n  File \"x.py\", line 3, in step\n    loss.backward()\nRuntimeError: "
              "DefaultCPUAllocator: not enough memory: you tried to allocate 217600000 bytes.")
    assert _first_line(LaunchError("1 of 2 ranks ran out of memory", {1: raised})) == (
        "rank 1 ran out of memory at batch 512 (per device): RuntimeError: DefaultCPUAllocator: "
        "not enough memory: you tried to allocate 217600000 bytes.")
    killed = "rank 0 ran out of memory at batch 512 (per device): the kernel's OOM killer"
    assert _first_line(LaunchError("out", {0: killed})) == killed
    assert _first_line(LaunchError("out", {0: "Traceback (most recent call last):\n  f\n"
                                               "MemoryError"})) == "MemoryError"
