"""Issue 16 through the plugin, with real ranks on CPU: peak memory judged against the baseline
(a workload that grew fails as a memory regression), a rank slowed on purpose named as a
straggler, FLOPs per sample counted and MFU asserted (torch ranks), and --dlperf-batch-size max
searching under a memory limit the OS enforces (NumPy ranks: each probe is a fresh launch)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from numpy_mlp import ADAPTER

from pytest_dlperf.core import cgroup
from pytest_dlperf.plugin.launches import PROBE_STEPS

# The memory cases share the machine (scripts/test's first pass); the straggler test does not.

torch = pytest.importorskip("torch")  # at import: see test_own_model.py

WORKLOADS = """
import os
import time

import pytest

from pytest_dlperf import Parts, Workload

WIDTH = 256


# torch is imported in the ranks only: each of this file's pytest runs would otherwise spend
# ~2 s importing it at collection.
def mlp(ctx):
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self, rank, ballast_mb, delay_s):
            super().__init__()
            self.body = torch.nn.Linear(WIDTH, WIDTH)
            self.head = torch.nn.Linear(WIDTH, 10)
            self.rank, self.delay_s = rank, delay_s
            # Resident all along, like a model that grew: every window's peak holds it.
            self.register_buffer("ballast", torch.ones(ballast_mb * 2 ** 18))

        def forward(self, x):
            if self.rank == 1 and self.delay_s:  # a slow device, on rank 1 only
                time.sleep(self.delay_s)
            return self.head(torch.relu(self.body(x)))

    model = Mlp(ctx.rank, int(os.environ.get("BALLAST_MB", "0")),
                float(os.environ.get("SLOW_RANK_S", "0")))
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, WIDTH),
                 targets=lambda: torch.randint(0, 10, (ctx.batch_size,)))


def wide(ctx):
    # Its trainer is wide_adapter's (NumPy): a probe's rank starts in ~1 s, not the ~5 s of a
    # torch rank's import.
    import numpy as np

    rng = np.random.default_rng(ctx.seed)
    return Parts(model=rng.standard_normal((1024, 1024)) / 32.0,
                 inputs=rng.standard_normal((ctx.batch_size, 1024)),
                 targets=rng.integers(0, 10, ctx.batch_size))


MLP = Workload("mlp", recipes={"torch": mlp}, batch_size={"cpu": 32})
WIDE = Workload("wide", recipes={"numpy": wide}, batch_size={"cpu": 8})


def test_mlp(cluster, throughput_meter):
    throughput_meter.measure("torch", MLP)


@pytest.mark.dlperf(min_mfu=0.5)
def test_mfu(throughput_meter):
    throughput_meter.measure("torch", MLP)


def test_wide(throughput_meter):
    found = os.environ.get("FOUND")
    throughput_meter.measure("wide_adapter", WIDE, batch_size=int(found) if found else None)


def test_wide_plus_one(throughput_meter):
    throughput_meter.measure("wide_adapter", WIDE, batch_size=int(os.environ["FOUND"]) + 1)
"""

# The wide model's trainer: ~16 MiB a sample at the step's peak (8 MiB of a widened activation
# and as much again after ReLU), so memory grows with the batch in steps far larger than a
# process's own jitter (a NumPy rank's own start is ~60 MiB, and moves by well under one); with GROW_AFTER set, from that step on it trains one sample more
# than its batch: what memory at the edge does when it is not steady (more than a probe's steps
# see). Beside tests/numpy_mlp.py's adapter, whose eager trainer's parts it takes.
WIDE_ADAPTER = """
import os

import numpy as np
from numpy_mlp_adapter import Eager

DISTRIBUTION = "numpy"
RECIPE_FOR = "numpy"


class WideTrainer(Eager):
    def __init__(self, spec, dist, recipe):
        parts = recipe(spec.context(dist.rank, dist.world_size, dist.local_rank, "cpu"))
        self.weight, self.inputs, self.dist = parts.model, parts.inputs, dist
        self.grow_after, self.grow_by = int(os.environ.get("GROW_AFTER", "0")), 1
        once = os.environ.get("GROW_ONCE")  # FILE:N: the Nth trainer built grows (one launch)
        if once:
            path, nth = once.rsplit(":", 1)
            built = int(open(path).read() or 0) + 1 if os.path.exists(path) else 1
            open(path, "w").write(str(built))
            if built == int(nth):  # beyond the diagnostic step's two more (PHASE_EXTRA)
                self.grow_after, self.grow_by = 3, 3
        self.calls, self._loss = 0, float("nan")

    def step(self, extra=0):
        self.calls += extra == 0  # training steps: GROW_AFTER counts these
        x = self.inputs
        if self.calls > self.grow_after > 0:
            x = np.concatenate([x, x[:self.grow_by]])
        if extra:
            x = np.concatenate([x] + [x[:1]] * extra)
        if os.environ.get("SHARED_BATCH"):  # a rank holds its share of the batch's memory
            x = x[:max(1, len(x) // self.dist.world_size)]
        h = x @ self.weight
        act = np.maximum(np.repeat(h[:, :, None], 1024, axis=2), 0.0)
        self._loss = float(act.mean())
        self.weight -= 1e-6 * (x.T @ h) / len(x)

    def phase_plan(self):
        # With PHASE_EXTRA set, the diagnostic steps after the windows train that many samples
        # more than the batch: memory the measurement takes beyond the training steps (as
        # torch's separate all-reduce holds a copy of every gradient).
        from pytest_dlperf.frameworks import PhasePlan

        extra = int(os.environ.get("PHASE_EXTRA", "0"))
        return PhasePlan([("forward+backward+optimizer", lambda: self.step(extra))])


def build_trainer(spec, dist, recipe):
    return WideTrainer(spec, dist, recipe)
"""

SHORT = ("-p", "no:cacheprovider", "--dlperf-warmup-steps", "2", "--dlperf-steps", "5",
         "--dlperf-repeats", "2", "--dlperf-unstable-cv", "10", "--dlperf-baselines", "bl")


def limit_cgroups() -> set[Path]:
    """The rank cgroups --dlperf-memory-limit made under this process's own (ranks start in it)."""
    return {child for _, own in cgroup.own_cgroups()
            for child in Path(own).glob("pytest-dlperf-*")}


def left_behind(before: set[Path], within_s: float = 10.0) -> set[Path]:
    """Rank cgroups made since ``before`` that hold no process and are still there ``within_s``
    later: those of launches that ended (an ended rank's is removed within 5 s). Another
    worker's launches make theirs under the same cgroup in scripts/test's first pass: while
    they run, their ranks are in them; once they end, they go."""
    deadline = time.monotonic() + within_s
    while True:
        left = set()
        for path in limit_cgroups() - before:
            try:
                if not (path / "cgroup.procs").read_text().split():
                    left.add(path)
            except FileNotFoundError:  # removed meanwhile
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def benches(path: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    return {b["name"]: b["extra_info"] for b in json.loads(path.read_text())["benchmarks"]}


@pytest.mark.usefixtures("subprocess_env")
def test_a_workload_that_grew_fails_as_a_memory_regression(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_w=WORKLOADS)
    run = (*SHORT, "--dlperf-launches", "2", "--devices-per-node", "1")
    first = pytester.runpytest_subprocess(*run, "-k", "mlp or mfu", "--dlperf-update-baselines",
                                          "--dlperf-json", "1.json", timeout=300)
    first.assert_outcomes(passed=2)
    recorded = benches(pytester.path / "1.json")["test_mlp[1n1d]"]
    (rank,) = recorded["peak_memory_per_rank"]
    assert rank["memory_source"] == "host_rss_bytes"
    assert recorded["peak_memory_bytes"] == rank["peak_memory_bytes"] > 50 * 2 ** 20
    baseline = json.loads(next((pytester.path / "bl").rglob("test_mlp-1n1d/*.json")).read_text())
    peak = baseline["metrics"]["peak_memory_bytes"]
    assert peak["higher_is_better"] is False and len(peak["launches"]) == 2
    # Exactly what the counter finds in this MLP: both layers forward, the weight gradients of
    # both, the input gradient of the second only (the batch itself needs none). 2 a multiply-add.
    body, head = 256 * 256, 256 * 10
    assert recorded["flops_per_sample"] == 2 * (2 * body + 3 * head)
    assert recorded["flops_source"] == "FlopCounterMode (meta)"
    assert recorded["achieved_flops_per_s"] == pytest.approx(
        recorded["flops_per_sample"] * recorded["samples_per_s"])
    # a CPU without a stated peak: MFU against a core's measured GEMM (issue 74), which holds
    # no floor: min_mfu is not checked against it
    assert recorded["mfu"] > 0 and recorded["mfu_peak"]["device"] == "measured GEMM"
    first.stdout.fnmatch_lines(["*min_mfu 50.0% (@pytest.mark.dlperf) is not checked: this "
                                "CPU's MFU is taken against a dense GEMM measured on it, not the "
                                "hardware's peak*--dlperf-peak-flops*"])

    monkeypatch.setenv("BALLAST_MB", "300")  # the model now holds 300 MiB more
    # (no extra launches for an inconclusive throughput verdict: memory is what is judged here)
    # Memory is what is judged: the throughput's tolerance wide open, since this test shares
    # the machine in CI's first pass (a run there read half the recorded speed, 2026-12-06, and
    # failed as a throughput regression, whose message came first)
    second = pytester.runpytest_subprocess(*run, "-k", "mlp", "--dlperf-json", "2.json",
                                           "--dlperf-max-repeats", "2", "--dlperf-tolerance",
                                           "0.9", timeout=300)
    second.assert_outcomes(failed=1)
    # (in MiB or GiB: a baseline above ~724 MiB with the 300 grows past 1 GiB)
    second.stdout.fnmatch_lines(["*MEMORY REGRESSION in test_w.py::test_mlp[[]1n1d[]]: peak "
                                 "memory * [MG]iB (*the largest on rank 0 (node 0, local rank 0*"
                                 "is above the threshold*baseline*memory tolerance 10.0%*"])
    judged = benches(pytester.path / "2.json")["test_mlp[1n1d]"]
    assert judged["memory_verdict"]["outcome"] == "regression"
    assert judged["peak_memory_bytes"] - recorded["peak_memory_bytes"] > 250 * 2 ** 20


@pytest.mark.alone("a rank slowed on purpose is named a straggler by its timings")
@pytest.mark.usefixtures("subprocess_env")
def test_a_rank_slowed_on_purpose_is_named_and_min_mfu_fails_a_case_below_it(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_w=WORKLOADS)
    monkeypatch.setenv("SLOW_RANK_S", "0.02")
    result = pytester.runpytest_subprocess(
        *SHORT, "--dlperf-launches", "1", "--devices-per-node", "2", "-k", "1n2d or mfu",
        "--dlperf-peak-flops", "1P", "--dlperf-json", "r.json", timeout=300)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*MFU BELOW MINIMUM in test_w.py::test_mfu: MFU *% is below min_mfu 50.0%*"
        "(277.5 kFLOP per sample x *samples/s per device) of --dlperf-peak-flops's "
        "1.0 PFLOP/s fp32 dense peak*",
        "*straggler in test_w.py::test_mlp[[]1n2d[]]: rank 1 (node 0, local rank 1, host *) "
        "takes * ms a step of its own (forward and backward without the all-reduce)*"
        "--dlperf-straggler-threshold 10%*"])
    assert "rank 0 (node 0, local rank 0" not in result.stdout.str()
    info = benches(pytester.path / "r.json")
    ranks = info["test_mlp[1n2d]"]["peak_memory_per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[1]["own_step_s"] - ranks[0]["own_step_s"] > 0.015
    # a CPU's stated peak is a core's: the rank's is it times the rank's threads
    threads = info["test_mfu"]["environment"]["threads"]
    assert info["test_mfu"]["mfu"] == pytest.approx(
        info["test_mfu"]["achieved_flops_per_s"] / (1e15 * threads))


@pytest.mark.usefixtures("subprocess_env")
def test_batch_size_max_finds_the_largest_batch_under_a_memory_limit(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_w=WORKLOADS, wide_adapter=WIDE_ADAPTER,
                        numpy_mlp_adapter=ADAPTER)
    cgroups = limit_cgroups()
    run = (*SHORT, "--dlperf-launches", "1", "--devices-per-node", "1",
           "--dlperf-memory-limit", "256M", "--dlperf-steps", "2", "--dlperf-repeats", "1",
           "--dlperf-max-repeats", "1")
    # The diagnostic steps after the windows hold two samples more than the batch: the probes
    # run one of them, so what they find is what the measurement holds (no step down here).
    monkeypatch.setenv("PHASE_EXTRA", "2")
    search = pytester.runpytest_subprocess(*run, "-k", "test_wide and not plus",
                                           "--dlperf-batch-size", "max",
                                           "--dlperf-update-baselines", "--dlperf-json",
                                           "1.json", timeout=600)
    search.assert_outcomes(passed=1)
    info = benches(pytester.path / "1.json")["test_wide"]
    found = info["batch_search"]["found"]
    assert info["batch_size"] == found and info["batch_size_requested"] == "max"
    assert [p for p in info["batch_search"]["probes"] if p["stage"] != "probe"] == []
    assert info["fingerprint"]["batch_size"] == "max"
    probes = {p["batch"]: p for p in info["batch_search"]["probes"]}
    assert probes[found]["fits"] and not probes[found + 1]["fits"]
    assert "ran out of memory" in probes[found + 1]["message"]
    assert 2 <= found < 30, "the limit should bound this workload within a few dozen"
    search.stdout.fnmatch_lines([f"*test_wide*max={found}*"])
    # a log's lines (not a terminal): each probe's outcome, and no probe's window figure (one
    # showed a window, then ran out of memory at its diagnostic step: issue 74)
    search.stdout.fnmatch_lines([f"pytest-dlperf: test_wide batch-size probe {found}: fits (*"])
    search.stdout.fnmatch_lines([f"pytest-dlperf: test_wide batch-size probe {found + 1}: out of "
                                 "memory (*"])
    assert not [line for line in search.stdout.lines if "probe" in line and "window" in line]

    # A later search starts from that answer: two probes when nothing changed. Here the
    # workload trains one sample more than its batch after a probe's steps (memory at the edge
    # that is not steady): the measurement at the found batch runs out of memory, and steps
    # down to one less, which it measures.
    monkeypatch.setenv("GROW_AFTER", str(PROBE_STEPS))
    again = pytester.runpytest_subprocess(*run, "-k", "test_wide and not plus",
                                          "--dlperf-batch-size", "max", "--dlperf-json",
                                          "2.json", timeout=600)
    again.assert_outcomes(passed=1)
    second = benches(pytester.path / "2.json")["test_wide"]
    searched = second["batch_search"]
    assert searched["seeded"] and searched["start"] == found
    assert [(p["batch"], p["fits"], p["stage"]) for p in searched["probes"]] == [
        (found, True, "probe"), (found + 1, False, "probe"), (found, False, "measurement")]
    assert f"ran out of memory at batch {found}" in searched["probes"][-1]["message"]
    assert searched["found"] == second["batch_size"] == found - 1
    again.stdout.fnmatch_lines([f"*test_wide*max={found - 1}*"])
    monkeypatch.delenv("GROW_AFTER")

    # Issue 74: a measurement's later launch out of memory at the found batch, where the
    # earlier one fitted, ran every launch again one batch down (InsightFace: 19.5 minutes).
    # Now it runs again at the same batch, the launches that fitted kept. Trainers built: the
    # probes at found and found + 1, launch 1, launch 2 (grows once: out of memory), launch 2
    # again, launch 3.
    monkeypatch.setenv("GROW_ONCE", f"{pytester.path / 'built.txt'}:4")
    kept = pytester.runpytest_subprocess(
        *SHORT, "--devices-per-node", "1", "--dlperf-memory-limit", "256M", "--dlperf-steps", "2",
        "--dlperf-launches", "3", "--dlperf-repeats", "3", "--dlperf-max-repeats", "3",
        # What is checked is the launches, not the speed: a recording run (seeded all the
        # same), not a judging one. Judged at 50% beside the first pass's other worker, its
        # three launches read 67 samples/s against the 210 one launch recorded minutes earlier
        # (2-step windows; a fresh-clone rehearsal, 2026-12-07) and failed it as a regression.
        "--dlperf-update-baselines", "--dlperf-unstable-cv", "50",
        "-k", "test_wide and not plus", "--dlperf-batch-size", "max", "--dlperf-json",
        "3.json", timeout=600)
    kept.assert_outcomes(passed=1)
    third = benches(pytester.path / "3.json")["test_wide"]
    assert [(p["batch"], p["fits"], p["stage"]) for p in third["batch_search"]["probes"]] == [
        (found, True, "probe"), (found + 1, False, "probe"),
        (found, False, "measurement, rerun")]
    assert third["batch_size"] == found and len(third["samples_per_s_launches"]) == 3
    assert (pytester.path / "built.txt").read_text() == "6"  # no launch beyond the rerun
    kept.stdout.fnmatch_lines([f"pytest-dlperf: *test_wide: --dlperf-batch-size max found "
                               f"batch {found} in 2 probe(s), * (from an earlier run's value); "
                               "1 launch(es) ran out of memory there and ran again, the "
                               "launches that fitted kept"])
    monkeypatch.delenv("GROW_ONCE")

    # Checked apart from the search: the found batch trains, one more runs out of memory
    # (and is reported as such, with the batch).
    monkeypatch.setenv("FOUND", str(found))
    edge = pytester.runpytest_subprocess(*run, "-k", "test_wide", timeout=600)
    edge.assert_outcomes(passed=1, failed=1)
    edge.stdout.fnmatch_lines([
        "*test_wide_plus_one out of memory on 1n1d: 1 of 1 ranks ran out of memory*",
        f"*rank 0 ran out of memory at batch {found + 1} (per device)*"])
    # Every rank's cgroup is removed once its launch ended, OOM-killed or not.
    assert left_behind(cgroups) == set()
