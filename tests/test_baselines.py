from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_dlperf.baselines import SCHEMA_VERSION, Baseline, BaselineError, BaselineStore, parse

FP = {"device_type": "cpu", "device_model": "Fake CPU 9000", "nodes": 1, "devices_per_node": 2,
      "framework": "torch", "framework_version": "2.14.1", "precision": "fp32",
      "model": "resnet50", "batch_size": 2, "image_size": 64, "protocol": "w5-s10-r5",
      "python": "3.11", "threads_per_worker": 1}
CASE = "test_resnet50_torch.py::test_resnet50_v15[1n2d-fp32]"


def _baseline(**kw: object) -> Baseline:
    data = dict(case=CASE, fingerprint=FP, repeats=[10.0, 11.0, 12.0], median=11.0)
    data.update(kw)
    return Baseline(**data)  # type: ignore[arg-type]


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "fresh" / "baselines")  # created on first save
    path = store.save(_baseline(tolerance=0.1))
    assert path.parent.parent.name == "test_resnet50_torch"
    assert path.parent.name == "test_resnet50_v15-1n2d-fp32"
    loaded = store.load(CASE, FP)
    assert loaded == _baseline(tolerance=0.1)
    text = path.read_text()
    assert text.endswith("}\n") and json.loads(text)["schema_version"] == SCHEMA_VERSION
    assert list(json.loads(text)) == sorted(json.loads(text))  # sorted keys: diffable
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind


def test_another_fingerprint_has_no_baseline(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.save(_baseline())
    assert store.load(CASE, {**FP, "device_model": "Other CPU"}) is None
    assert store.load(CASE, {**FP, "framework_version": "2.15.0"}) is None


@given(repeats=st.lists(st.floats(0.01, 1e6, allow_nan=False), min_size=1, max_size=20),
       tolerance=st.none() | st.floats(0, 0.99))
def test_schema_round_trips(repeats: list[float], tolerance: float | None) -> None:
    original = _baseline(repeats=repeats, median=sorted(repeats)[len(repeats) // 2],
                         tolerance=tolerance)
    assert parse(json.loads(json.dumps(original.to_json())), Path("x.json")) == original


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not valid JSON"),
    ('{"schema_version": 1, "case"', "not valid JSON"),  # truncated
    ("[]", "expected a JSON object"),
    ('{"schema_version": 99}', "newer than this pytest-dlperf"),
])
def test_unusable_files_name_the_file_and_the_problem(tmp_path: Path, content: str,
                                                      problem: str) -> None:
    store = BaselineStore(tmp_path)
    path = store.path_for(CASE, FP)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(BaselineError, match=problem) as info:
        store.load(CASE, FP)
    assert str(path) in str(info.value)
    assert path.read_text() == content  # never touched by a read


@pytest.mark.parametrize("field, value, problem", [
    ("repeats", "fast", "'repeats' must be"),
    ("repeats", [], "'repeats' must be"),
    ("median", -1, "'median' must be"),
    ("median", True, "'median' must be"),
    ("tolerance", 1.5, "'tolerance' must be"),
    ("fingerprint", [], "'fingerprint' must be"),
])
def test_wrong_types_are_refused(tmp_path: Path, field: str, value: object, problem: str) -> None:
    data = _baseline().to_json()
    data[field] = value
    with pytest.raises(BaselineError, match=problem):
        parse(data, tmp_path / "b.json")


def test_update_over_a_corrupt_file_keeps_it_as_bak(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    path = store.path_for(CASE, FP)
    path.parent.mkdir(parents=True)
    path.write_text("{oops")
    store.save(_baseline())
    assert path.with_name(path.name + ".bak").read_text() == "{oops"
    assert store.load(CASE, FP) == _baseline()
