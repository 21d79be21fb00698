"""scripts/nightly, as the nightly workflow runs it: two real nights on this machine. Night 1
records the runner's baselines and passes; night 2 fails as a regression against a runner whose
earlier nights were a hundred times faster (its stored launches scaled by baseline_files.scaled, as
test_e2e does). Both nights go into the runner's history. The committed baselines play no
part."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from baseline_files import scaled

REPO = Path(__file__).resolve().parents[1]
# A short protocol (its own fingerprint): what is tested is the gate's flow, not the figures.
# No extra launches for an inconclusive verdict (--dlperf-max-repeats = repeats): night two's 2
# launches against a store 100x faster are a significant drop on their own (as test_e2e's). (Night two used to be
# slowed for real, by CPU hogs on every core: 200-280 s of the suite, the hogged night's launches
# starting 2-3x slower, and nothing else could run beside it.)
CASE = ["-k", "resnet50 and torch and 1n1d and fp32 and eager and not scaling",
        "--dlperf-protocol", "quick", "--dlperf-warmup-steps", "2", "--dlperf-steps", "4",
        "--dlperf-repeats", "2", "--dlperf-launches", "2", "--dlperf-max-repeats", "2",
        # 4-step windows on a shared CPU: night one may not refuse its baseline as unstable
        "--dlperf-unstable-cv", "10", "-p", "no:cacheprovider"]


def night(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    env.update(DLPERF_NIGHTLY_STORE=str(tmp_path / "runner-store"),
               DLPERF_NIGHTLY_OUT=str(tmp_path / "out"), DLPERF_NIGHTLY_PYTHON=sys.executable,
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    return subprocess.run([str(REPO / "scripts" / "nightly"), *CASE], capture_output=True,
                          text=True, env=env, timeout=900, stdin=subprocess.DEVNULL)


def test_night_one_records_then_a_slower_night_two_fails(tmp_path: Path) -> None:
    first = night(tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    stored = list((tmp_path / "runner-store").rglob("*.json"))
    assert [p.parent.name for p in stored] == ["test_resnet50_v15-1n1d-fp32-eager"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "First night for 1 case(s)" in summary and "**Passed**" in summary
    assert (tmp_path / "out" / "results.json").exists()
    recorded = scaled(json.loads(stored[0].read_text()), 100)
    stored[0].write_text(recorded)

    second = night(tmp_path)
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    assert "REGRESSION in perf_tests/test_resnet50_torch.py::test_resnet50_v15[1n1d-fp32-eager]" \
        in second.stdout
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "**Failed**" in summary and "First night" not in summary
    assert stored[0].read_text() == recorded  # a failing night never moves the baseline
    # both nights are in the runner's history, kept beside its baselines
    from pytest_dlperf.store.history import History

    (db,) = (tmp_path / "runner-store").rglob("history.db")
    # in the runner's own folder of the store, beside its baselines
    assert db.parent.parent == tmp_path / "runner-store" and db.parent in stored[0].parents
    history = History.open(str(db))
    (key,) = history.keys()
    assert key["runs"] == 2 and key["case_key"].endswith("[1n1d-fp32-eager]")
    assert [p.baseline_action for p in history.series(key["case_key"], key["fingerprint_id"])
            ] == ["recorded", None]
    assert "history in " + str(db) in second.stderr
    # the summary says what regressed first, and the history's page is in the artifact's folder
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert ("Regressed (1):\n\n- `perf_tests/test_resnet50_torch.py::test_resnet50_v15"
            "[1n1d-fp32-eager]`: throughput") in summary
    assert "The history's page is `report/index.html` in this job's artifact." in summary
    assert "test_resnet50_v15[1n1d-fp32-eager]" in (tmp_path / "out" / "report" /
                                                   "index.html").read_text()
