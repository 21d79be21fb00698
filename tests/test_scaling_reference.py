"""Issue 52: a recording run refused a 1n1d case as unstable, then recorded the 1n2d cases'
scaling efficiency taken against it (2787.4%), and the next run failed "SCALING REGRESSION ...
below the threshold 2648.0%". Nothing derived from a refused measurement is recorded, and a
recording run refuses an efficiency no layout reaches (verdict.superlinear)."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.usefixtures("subprocess_env"),
              pytest.mark.alone("it judges scaling efficiency from timings it recorded")]

# Every step sleeps 2 ms, so that windows are steady; on one device, all but the first of its
# windows' steps (20 a window after 2 warm-up steps) 30 ms: windows far apart (refused at
# recording), and a median ~15 times slower than two devices' (an efficiency of ~700%).
DISTURBED = """
import time

import torch

from pytest_dlperf import Parts, Workload


class Disturbed(torch.nn.Module):
    def __init__(self, alone):
        super().__init__()
        self.fc, self.alone, self.calls = torch.nn.Linear(32, 10), alone, 0

    def forward(self, x):
        window = (self.calls - 2) // 20
        self.calls += 1
        time.sleep(0.03 if self.alone and window > 0 else 0.002)
        return self.fc(x)


def build(ctx):
    return Parts(model=Disturbed(ctx.world_size == 1), inputs=torch.randn(ctx.batch_size, 32),
                 targets=torch.randint(0, 10, (ctx.batch_size,)))


MLP = Workload(name="disturbed", recipes={"torch": build}, batch_size={"cpu": 16},
               flops_per_sample=1.0)


def test_scaled(cluster, throughput_meter):
    throughput_meter.measure("torch", MLP)
"""


def test_a_refused_reference_leaves_nothing_derived_from_it_recorded(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_scaled=DISTURBED)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--devices-per-node", "2", "--dlperf-warmup-steps", "2",
        "--dlperf-steps", "20", "--dlperf-repeats", "4", "--dlperf-launches", "1",
        "--dlperf-phases", "off", "--dlperf-straggler-threshold", "0.99",
        # Windows within 40% are recorded (two ranks' 2 ms steps have read 27% apart here);
        # the one-device case's, ~150% apart, are not.
        "--dlperf-unstable-cv", "40%",
        "--dlperf-baselines", "bl", "--dlperf-update-baselines", "--dlperf-json", "r.json",
        timeout=300)
    cases = {b["name"]: b["extra_info"] for b in
             json.loads((pytester.path / "r.json").read_text())["benchmarks"]}
    single, pair = cases["test_scaled[1n1d]"], cases["test_scaled[1n2d]"]
    assert single["verdict"]["text"] == "not recorded (unstable)"
    # Not the refused case's median: a reference measured again.
    result.stdout.fnmatch_lines(["*test_scaled[[]1n2d[]] 1n1d reference: window 1/4 *"])
    # The reference was measured again (the refused case gives none), as slow: the efficiency
    # no layout reaches is refused, and the case fails naming the bound.
    assert pair["scaling_efficiency"] > 1.5
    assert pair["verdict"]["text"] == "not recorded (efficiency)"
    result.stdout.fnmatch_lines([
        "*test_scaled[[]1n2d[]]: baseline not recorded: scaling efficiency *% (speedup * on 2 "
        "devices) is above 100%, and data parallelism at the same per-device batch gives each "
        "of the 2 devices the 1n1d work plus the gradients' exchange, which cannot reach 100%:"
        " the 1n1d reference (* samples/s) was likely disturbed or slow*A recording run "
        "refuses an efficiency above 150%*"])
    result.assert_outcomes(failed=2)
    assert not list((pytester.path / "bl").rglob("*.json"))
