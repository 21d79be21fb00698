"""The summary table and the results file, from records built by hand (no training)."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_dlperf.core.jsonio import write_json_atomic
from pytest_dlperf.core.protocol import QUICK, Result
from pytest_dlperf.core.topology import Topology
from pytest_dlperf.core.workload import CaseWorkload, Precision
from pytest_dlperf.report.results import benchmark_entry, results_json
from pytest_dlperf.report.tables import markdown_table, pivot_rows, rows, text_table
from pytest_dlperf.verdict.record import CaseReport
from pytest_dlperf.verdict.stats import compare

MACHINE = {"node": "box-1", "cpu": {"brand_raw": "Fake CPU"}}


def make_report(baseline: float | None) -> CaseReport:
    result = Result(samples_per_s=[10.0, 12.0, 11.0], window_s=[0.8, 0.6667, 0.7273], steps=2,
                    global_batch=4, warmup_s=1.0, wall_s=9.0, launch_windows=[1, 1, 1])
    return CaseReport(
        case="test_r.py::test_x[1n2d-amp]", name="test_x[1n2d-amp]",
        nodeid="perf/test_r.py::test_x[1n2d-amp]", params={"cluster": "1n2d", "amp": "amp"},
        framework="torch", framework_version="2.14.1", topology=Topology(1, 2, "cpu", "Fake CPU"),
        precision=Precision("amp", "cpu"),
        workload=CaseWorkload("resnet50", "images", 2, {"image_size": 64}),
        protocol=QUICK, result=result, cv=0.0909, param="1n2d-amp",
        verdict=compare(result.launches, None if baseline is None else
                        [[baseline], [baseline * 1.01], [baseline * 0.99]], 0.05))


def test_rows_carry_dlperf_columns() -> None:
    scaled = replace(make_report(12.5), speedup=1.7, efficiency=0.85)
    table = rows([benchmark_entry(make_report(12.5)), benchmark_entry(scaled)])
    assert table[0] == ["test_r.py::test_x[1n2d-amp]", "1 x 2", "amp(bfloat16)", "2",
                        "11.0 images/s", "10.0-12.0", "9.1%", "3/3L", "-", "-", "-", "12.5", "-12.0%", "inconclusive"]
    assert table[1][8] == "1.70 (85%)"
    text = text_table(table)
    assert text[0].split() == ["case", "nodes", "x", "dev", "precision", "batch/dev", "throughput",
                               "(median)", "min-max", "cv", "n", "speedup", "(eff.)", "peak", "mem",
                               "FLOP/s/dev", "(MFU)", "baseline",
                               "delta", "verdict"]
    assert text[1].startswith("----")
    assert markdown_table(table)[2].startswith("| test_r.py::test_x[1n2d-amp] | 1 x 2 |")


def test_results_json_is_pytest_benchmark_shaped(tmp_path: Path) -> None:
    data = results_json([make_report(None)], {"id": "0" * 40, "dirty": False}, MACHINE)
    bench = data["benchmarks"][0]
    assert bench["stats"]["rounds"] == 3 and bench["stats"]["iterations"] == 2
    assert bench["stats"]["data"] == [0.4, 0.33335, 0.36365]  # seconds per step, per window
    assert bench["extra_info"]["samples_per_s"] == 11.0
    assert bench["extra_info"]["verdict"]["text"] == "no-baseline"
    assert bench["extra_info"]["samples_per_s_cv"] == 0.0909
    assert bench["extra_info"]["repeats_measured"] == 3
    assert bench["extra_info"]["baseline_update"] is None
    assert bench["param"] == "1n2d-amp"
    assert bench["extra_info"]["unit"] == "images"
    assert bench["extra_info"]["sizes"] == {"image_size": 64}
    assert data["machine_info"] == MACHINE  # as the pytest side's hook call gave it
    assert data["commit_info"] == {"id": "0" * 40, "dirty": False}  # the session's, as given


def test_markdown_cli(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(results_json([make_report(8.0)], {}, MACHINE)))
    out = subprocess.run([sys.executable, "-m", "pytest_dlperf", "report", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 0
    assert "| test_r.py::test_x[1n2d-amp] | 1 x 2 | amp(bfloat16) | 2 | 11.0 images/s | 10.0-12.0 | 9.1% " \
        "| 3/3L | - |" in out.stdout
    assert "| +37.5% | improvement |" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "pytest_dlperf", "report", str(tmp_path / "no.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not a pytest-dlperf results file" in bad.stderr


def test_two_frameworks_are_put_side_by_side_per_case(tmp_path: Path) -> None:
    torch_case = make_report(None)
    tf_case = replace(make_report(None), framework="tensorflow", speedup=0.4, efficiency=0.2,
                      result=Result(samples_per_s=[5.0, 6.0, 7.0], window_s=[1.6, 1.333, 1.143],
                                    steps=2, global_batch=4, warmup_s=1.0, wall_s=9.0))
    tf_only = replace(make_report(None), framework="tensorflow", name="test_x[1n1d-amp]")
    data = results_json([torch_case, tf_case, tf_only], {}, MACHINE)
    pivot = data["dlperf_frameworks_side_by_side"]
    assert pivot["frameworks"] == ["torch", "tensorflow"]
    first, second = pivot["rows"]
    assert first["case"] == "test_x[1n2d-amp]" and first["topology"] == "1n2d"
    assert first["torch"]["samples_per_s"] == 11.0 and first["torch"]["speedup"] is None
    assert first["tensorflow"] == {"samples_per_s": 6.0, "speedup": 0.4, "verdict": "no-baseline"}
    assert "torch" not in second and second["tensorflow"]["samples_per_s"] == 11.0
    header, table = pivot_rows(pivot)
    assert header[-3:] == ["unit", "torch (speedup)", "tensorflow (speedup)"]
    assert table == [["test_x[1n2d-amp]", "1n2d", "amp(bfloat16)", "2", "images/s", "11.0",
                      "6.0 (0.40)"],
                     ["test_x[1n1d-amp]", "1n2d", "amp(bfloat16)", "2", "images/s", "-", "11.0"]]
    assert results_json([torch_case], {}, MACHINE)["dlperf_frameworks_side_by_side"] is None
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, "-m", "pytest_dlperf", "report", str(path)],
                         capture_output=True, text=True)
    assert "| test_x[1n2d-amp] | 1n2d | amp(bfloat16) | 2 | images/s | 11.0 | 6.0 (0.40) |" in out.stdout


def test_the_records_fields_are_read_by_attribute_and_still_dump_as_json(tmp_path: Path) -> None:
    """``report.result`` is an object while ``report.environment`` was a dict: after a
    two-minute run, ``report.result["median"]`` raised TypeError. Every field reads by
    attribute; the mappings read by key too, compare equal to dicts and dump as JSON."""
    fingerprint = {"framework": "torch", "nodes": 1, "protocol": "w2-s2"}
    environment = {"python": "3.12.3", "parameters": 1234, "threads": {"intra": 2}}
    report = replace(make_report(None), fingerprint=fingerprint, environment=environment)
    assert report.result.median == 11.0
    assert report.environment.python == "3.12.3" and report.environment["python"] == "3.12.3"
    assert report.environment.threads.intra == 2
    assert report.fingerprint.framework == "torch" and report.fingerprint.get("nodes") == 1
    assert report.params.cluster == "1n2d"
    assert report.fingerprint == fingerprint and {**report.environment} == environment
    with pytest.raises(AttributeError, match="'pyhton'.*known: parameters, python, threads"):
        report.environment.pyhton  # noqa: B018
    with pytest.raises(TypeError, match="read-only"):
        report.environment["python"] = "2.7"  # type: ignore[index]
    assert report.environment.python == "3.12.3"
    assert copy.deepcopy(report).environment == environment
    text = json.dumps(results_json([report], {}, MACHINE))
    assert json.loads(text)["benchmarks"][0]["extra_info"]["fingerprint"] == fingerprint


def test_json_files_are_written_as_the_umask_says(tmp_path: Path) -> None:
    """The results file came out 0600 (a temp file renamed) whatever the umask."""
    for umask, mode in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        old = os.umask(umask)
        try:
            write_json_atomic(tmp_path / "r.json", {"a": 1})
        finally:
            os.umask(old)
        assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == mode, oct(umask)
        assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left
