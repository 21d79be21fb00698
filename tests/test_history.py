"""The history store (--dlperf-history), against a real SQLite file and a real PostgreSQL
server (started by the postgres_server fixture; skipped with the reason where it cannot start):
runs append through the plugin, concurrent writers lose nothing, a corrupt or newer store is
refused and left as it was, an older one is upgraded in place."""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from numpy_mlp import ADAPTER, ONE

from pytest_dlperf.core.phases import Phases
from pytest_dlperf.store import history as history_mod
from pytest_dlperf.store.history import History, HistoryError

pytest.importorskip("sqlalchemy")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "store" / "history.db")
    return str(request.getfixturevalue("postgres_url"))


def a_run(index: int, **overrides: object) -> dict[str, object]:
    started = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=index)
    return {"started_at": started, "commit_id": f"{index:040x}", "branch": "main",
            "dirty": False, "host": "runner-1", "machine": "box", "plugin_version": "0.1.0",
            "protocol": {"name": "quick"}, **overrides}


def a_case(value: float, case: str = "test_w.py::test_mlp[1n1d]") -> dict[str, object]:
    return {"case_key": case, "fingerprint": {"framework": "torch", "model": "mlp"},
            "fingerprint_id": "cpu__torch__abc", "framework": "torch", "model": "mlp",
            "unit": "samples", "verdict": "pass",
            "metrics": {"samples_per_s": [[value, value + 1], [value + 2]],
                        "peak_memory_bytes": [[1e9], [1.1e9]]}}


def test_a_run_reads_back_with_every_window_by_launch(store_url: str) -> None:
    store = History.open(store_url)
    assert store.schema_version() == history_mod.SCHEMA_VERSION
    first = store.append(a_run(0), [a_case(100.0)])
    second = store.append(a_run(1, branch="feature"), [a_case(90.0)])
    assert second != first
    points = store.series("test_w.py::test_mlp[1n1d]", "cpu__torch__abc")
    assert [p.launches for p in points] == [[[100.0, 101.0], [102.0]], [[90.0, 91.0], [92.0]]]
    assert [p.median for p in points] == [101.25, 91.25]  # the median of launch medians
    assert [(p.branch, p.commit_id[-1]) for p in points] == [("main", "0"), ("feature", "1")]
    assert points[0].started_at == dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    memory = store.series("test_w.py::test_mlp[1n1d]", "cpu__torch__abc", "peak_memory_bytes")
    assert [p.launches for p in memory] == [[[1e9], [1.1e9]]] * 2
    (key,) = store.keys()
    assert (key["runs"], key["framework"], key["fingerprint"]["model"]) == (2, "torch", "mlp")


WRITER = """
import datetime as dt, sys
from pytest_dlperf.store.history import History
store = History.open(sys.argv[1])
start = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
for i in range(int(sys.argv[3])):
    store.append({"started_at": start + dt.timedelta(minutes=i), "commit_id": None,
                  "branch": None, "dirty": None, "host": sys.argv[2], "machine": sys.argv[2],
                  "plugin_version": "0.1.0", "protocol": {}},
                 [{"case_key": "c", "fingerprint": {}, "fingerprint_id": "f",
                   "framework": "torch", "model": "m", "unit": "samples", "verdict": None,
                   "metrics": {"samples_per_s": [[float(i)] * 20] * 3}}])
"""


def test_concurrent_writers_lose_nothing(store_url: str) -> None:
    """Two runners writing at once, each its runs in transactions of its own, into a store
    neither has created yet."""
    runs = 40
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, store_url, f"runner-{n}",
                                 str(runs)], cwd=REPO, stderr=subprocess.PIPE, text=True)
               for n in range(2)]
    for writer in writers:
        _, err = writer.communicate(timeout=240)
        assert writer.returncode == 0, err
    points = History.open(store_url).series("c", "f")
    assert len(points) == 2 * runs
    assert sorted(p.host for p in points) == ["runner-0"] * runs + ["runner-1"] * runs
    assert all(len(p.values) == 60 for p in points)


def _sqlite_bytes(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_that_is_not_a_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    path.write_bytes(b"these are someone's notes, not a database\n" * 100)
    before = _sqlite_bytes(path)
    with pytest.raises(HistoryError, match=r"history.db is not an SQLite database .*left as it "
                                           r"is.*--dlperf-history"):
        History.open(str(path))
    assert _sqlite_bytes(path) == before


def test_a_newer_store_is_refused_and_left_as_it_was(store_url: str) -> None:
    import sqlalchemy as sa

    store = History.open(store_url)
    store.append(a_run(0), [a_case(100.0)])
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE dlperf_meta SET value = '7' WHERE key = 'schema_version'"))
    store.close()
    with pytest.raises(HistoryError, match="schema version 7, newer than this pytest-dlperf's "
                                           f"{history_mod.SCHEMA_VERSION}: a newer pytest-dlperf "
                                           "wrote it. It is left as it is; upgrade pytest-dlperf"):
        History.open(store_url)
    with store.engine.connect() as conn:  # nothing was written
        version = conn.execute(sa.text("SELECT value FROM dlperf_meta")).scalar()
        runs = conn.execute(sa.text("SELECT count(*) FROM dlperf_runs")).scalar()
    assert (version, runs) == ("7", 1)


def test_our_tables_without_their_version_are_refused(store_url: str) -> None:
    import sqlalchemy as sa

    History.open(store_url).close()
    engine = sa.create_engine(history_mod.engine_url(store_url))
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE dlperf_meta"))
    with pytest.raises(HistoryError, match="has pytest-dlperf's tables .* but no dlperf_meta"):
        History.open(store_url)


def test_a_shared_database_keeps_its_own_tables(store_url: str) -> None:
    import sqlalchemy as sa

    if "://" not in store_url:  # a database someone else made first
        Path(store_url).parent.mkdir(parents=True)
    engine = sa.create_engine(history_mod.engine_url(store_url))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE deployments (id INTEGER PRIMARY KEY, name TEXT)"))
        conn.execute(sa.text("INSERT INTO deployments VALUES (1, 'prod')"))
    History.open(store_url).append(a_run(0), [a_case(1.0)])
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT name FROM deployments")).scalar() == "prod"


def test_an_older_store_is_upgraded_in_place_keeping_its_runs(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlalchemy as sa

    History.open(store_url).append(a_run(0), [a_case(100.0)])
    upgraded: list[int] = []

    def add_a_column(conn: sa.Connection) -> None:
        upgraded.append(1)
        conn.execute(sa.text("ALTER TABLE dlperf_runs ADD COLUMN ci_url TEXT"))

    monkeypatch.setattr(history_mod, "SCHEMA_VERSION", history_mod.SCHEMA_VERSION + 1)
    monkeypatch.setitem(history_mod.MIGRATIONS, history_mod.SCHEMA_VERSION - 1, add_a_column)
    store = History.open(store_url)
    assert store.schema_version() == history_mod.SCHEMA_VERSION and upgraded == [1]
    History.open(store_url)  # already there: not run again
    assert upgraded == [1]
    with store.engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("dlperf_runs")}
    assert "ci_url" in columns
    assert [p.median for p in store.series("test_w.py::test_mlp[1n1d]", "cpu__torch__abc")] == [
        101.25]


@pytest.mark.parametrize(("raw", "message"), [
    ("mysql://db/x", "a mysql:// URL is not a store this knows"),
    ("   ", "expected a path"),
])
def test_bad_history_values_are_usage_errors(pytester: pytest.Pytester, raw: str,
                                            message: str) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", "--dlperf-history", raw)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*bad value for --dlperf-history=*{message}*"])


RUN = ("-p", "no:cacheprovider", "--devices-per-node", "1", "--dlperf-warmup-steps", "1",
       "--dlperf-steps", "2", "--dlperf-repeats", "2", "--dlperf-launches", "2",
       "--dlperf-unstable-cv", "10", "--dlperf-baselines", "bl")


@pytest.mark.usefixtures("subprocess_env")
def test_two_runs_through_the_plugin_append_two_points(pytester: pytest.Pytester,
                                                       store_url: str) -> None:
    pytester.makepyfile(test_h=ONE, numpy_mlp_adapter=ADAPTER)
    for night in (1, 2):
        # (--opt=VALUE: pytest settles its rootdir before it knows plugins' options, and an
        # existing path given apart would count as a test path and move it)
        result = pytester.runpytest_subprocess(*RUN, f"--dlperf-history={store_url}",
                                               "--dlperf-json", f"{night}.json", timeout=300)
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines([f"pytest-dlperf: history: appended run {night} (1 case(s)) "
                                     "to *"])
    store = History.open(store_url)
    (key,) = store.keys()
    assert key["case_key"].endswith("test_h.py::test_one") and key["runs"] == 2
    points = store.series(key["case_key"], key["fingerprint_id"])
    for night, point in enumerate(points, 1):
        (bench,) = json.loads((pytester.path / f"{night}.json").read_text())["benchmarks"]
        info = bench["extra_info"]
        # every window, by launch, as measured; the run's facts beside them
        assert point.launches == [[w] for w in info["samples_per_s_repeats"]]
        assert point.median == pytest.approx(info["samples_per_s"])
        assert point.host and point.verdict in ("no-baseline", "pass", "improvement")
    assert points[0].started_at < points[1].started_at
    memory = store.series(key["case_key"], key["fingerprint_id"], "peak_memory_bytes")
    assert len(memory) == 2 and all(v > 0 for p in memory for v in p.values)
    if importlib.util.find_spec("matplotlib") is None:
        return
    # the page, built from this store (tests/test_htmlreport.py checks it in depth)
    page = subprocess.run([sys.executable, "-m", "pytest_dlperf", "html", store_url,
                           "-o", str(pytester.path / "page")], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert page.returncode == 0, page.stderr
    index = (pytester.path / "page" / "index.html").read_text()
    assert key["case_key"] in index and "2 runs, newest" in index


STORE_GOES_AWAY = """
import shutil
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    # the store's disk went away while the case trained
    shutil.rmtree(Path(session.config.getoption("dlperf_history")).parent)
"""


@pytest.mark.usefixtures("subprocess_env")
def test_a_run_the_store_cannot_take_is_kept_and_added_later(pytester: pytest.Pytester,
                                                            tmp_path: Path) -> None:
    pytester.makepyfile(test_h=ONE, numpy_mlp_adapter=ADAPTER)
    pytester.makeconftest(STORE_GOES_AWAY)
    store = tmp_path / "gone" / "history.db"
    result = pytester.runpytest_subprocess(*RUN, f"--dlperf-history={store}", timeout=300)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the run did not reach its store
    result.stdout.fnmatch_lines(["pytest-dlperf: history: could not append this run to the "
                                 "history: *history.db: unable to open database file. Its 1 "
                                 "case(s) are kept in *dlperf-history-unsaved-*.json: "
                                 "`python -m pytest_dlperf history add * URL` appends them once "
                                 "the store is back"])
    (kept,) = pytester.path.glob("dlperf-history-unsaved-*.json")
    again = tmp_path / "back" / "history.db"
    added = subprocess.run([sys.executable, "-m", "pytest_dlperf", "history", "add", str(kept),
                            str(again)], capture_output=True, text=True, cwd=REPO)
    assert added.returncode == 0, added.stderr
    assert "appended run 1 (1 case(s))" in added.stdout
    (key,) = History.open(str(again)).keys()
    assert key["case_key"].endswith("test_h.py::test_one")
    (point,) = History.open(str(again)).series(key["case_key"], key["fingerprint_id"])
    assert len(point.values) == 2


def test_a_schema_1_store_gets_the_baseline_action_column_and_keeps_its_runs(
        store_url: str) -> None:
    """The real migration 1 -> 2: a store as schema 1 made it (no baseline_action column, its
    version 1) is upgraded when opened; its old runs accept no step, new ones say what they
    did to the baseline."""
    import sqlalchemy as sa

    History.open(store_url).append(a_run(0), [a_case(100.0)])
    engine = sa.create_engine(history_mod.engine_url(store_url))
    with engine.begin() as conn:  # back to what schema 1 wrote
        conn.execute(sa.text("ALTER TABLE dlperf_cases DROP COLUMN baseline_action"))
        conn.execute(sa.text("ALTER TABLE dlperf_cases DROP COLUMN interference"))
        conn.execute(sa.text("ALTER TABLE dlperf_cases DROP COLUMN phases"))
        conn.execute(sa.text("UPDATE dlperf_meta SET value = '1' WHERE key = 'schema_version'"))
    store = History.open(store_url)
    assert store.schema_version() == history_mod.SCHEMA_VERSION
    store.append(a_run(1), [{**a_case(90.0), "baseline_action": "recorded"}])
    points = store.series("test_w.py::test_mlp[1n1d]", "cpu__torch__abc")
    assert [(p.median, p.baseline_action, p.baseline_recorded) for p in points] == [
        (101.25, None, False), (91.25, "recorded", True)]


def some_phases(backward: float = 0.106) -> Phases:
    return Phases(seconds={"forward": 0.040, "backward": backward, "optimizer": 0.055,
                           "rest": 0.002, "exposed communication": 0.092},
                  order=["forward", "backward", "optimizer", "rest", "exposed communication"],
                  step_s=0.3, communication_s=0.07, gradient_bytes=98_000_000, how="ddp",
                  samples=4)


def test_each_run_keeps_its_phases_beside_its_samples(store_url: str) -> None:
    """A run's phases (Phases.to_json) read back with its point, as written; a run that ran
    no diagnostic steps has none."""
    store = History.open(store_url)
    store.append(a_run(0), [{**a_case(100.0), "phases": some_phases().to_json()}])
    store.append(a_run(1), [a_case(90.0)])
    store.append(a_run(2), [{**a_case(95.0), "phases": some_phases(0.2).to_json()}])
    points = store.series("test_w.py::test_mlp[1n1d]", "cpu__torch__abc")
    assert [p.phases is not None for p in points] == [True, False, True]
    assert points[0].phases == some_phases().to_json()
    assert Phases.from_json(points[2].phases or {}).seconds["backward"] == 0.2
    memory = store.series("test_w.py::test_mlp[1n1d]", "cpu__torch__abc", "peak_memory_bytes")
    assert memory[0].phases == points[0].phases  # every metric's points carry them


def test_a_schema_3_store_gets_the_phases_column_and_keeps_its_runs(store_url: str) -> None:
    """The real migration 3 -> 4: a store as schema 3 made it (no phases column) opens, its
    old runs have no phases, new ones keep theirs."""
    import sqlalchemy as sa

    History.open(store_url).append(a_run(0), [{**a_case(100.0), "baseline_action": "recorded",
                                                "interference": [{"share": 0.1}]}])
    engine = sa.create_engine(history_mod.engine_url(store_url))
    with engine.begin() as conn:  # back to what schema 3 wrote
        conn.execute(sa.text("ALTER TABLE dlperf_cases DROP COLUMN phases"))
        conn.execute(sa.text("UPDATE dlperf_meta SET value = '3' WHERE key = 'schema_version'"))
    store = History.open(store_url)
    assert store.schema_version() == history_mod.SCHEMA_VERSION == 4
    store.append(a_run(1), [{**a_case(90.0), "phases": some_phases().to_json()}])
    points = store.series("test_w.py::test_mlp[1n1d]", "cpu__torch__abc")
    assert [(p.median, p.baseline_action, p.phases) for p in points] == [
        (101.25, "recorded", None), (91.25, None, some_phases().to_json())]


def test_a_sessions_case_row_carries_its_phases_through_the_unsaved_file(
        tmp_path: Path) -> None:
    """What a session appends (case_row of its CaseReport), kept in the unsaved file when the
    store failed and added later, keeps the case's phases."""
    from types import SimpleNamespace

    from pytest_dlperf.store.history_rows import case_row, load_unsaved, save_unsaved

    fp = {"device_model": "cpu", "framework": "torch", "framework_version": "2.5",
          "protocol": "quick", "model": "mlp"}

    def report(phases: Phases | None) -> SimpleNamespace:
        return SimpleNamespace(
            case="test_w.py::test_mlp[1n1d]", fingerprint=fp, framework="torch",
            workload=SimpleNamespace(unit="samples"), verdict=SimpleNamespace(outcome="pass"),
            baseline_action=None, result=SimpleNamespace(interference=[]), phases=phases)

    metrics = {"samples_per_s": SimpleNamespace(launches=[[10.0, 11.0]])}
    rows = [case_row(report(some_phases()), metrics), case_row(report(None), metrics)]
    assert rows[0]["phases"] == some_phases().to_json() and rows[1]["phases"] is None
    save_unsaved(tmp_path / "unsaved.json", a_run(0), rows[:1])
    run, cases = load_unsaved(tmp_path / "unsaved.json")
    store = History.open(str(tmp_path / "history.db"))
    store.append(run, cases)
    (key,) = store.keys()
    (point,) = store.series(key["case_key"], key["fingerprint_id"])
    assert Phases.from_json(point.phases or {}) == some_phases()


def test_the_machines_nights_give_its_drift_between_runs(store_url: str) -> None:
    """Issue 73: where no baseline holds two runs, the drift between runs is pooled over the
    history's nights of every case of this machine, device type and protocol; other machines',
    other protocols' and one-night series are left out."""
    from pytest_dlperf.store.history_nights import machine_series
    from pytest_dlperf.verdict.drift import from_history

    here = {"machine": "box", "device_type": "cpu", "protocol": "w5-s10", "model": "mlp"}

    def case(key: str, value: float, **fp: object) -> dict[str, object]:
        fingerprint = {**here, **fp}
        return {**a_case(value, key), "fingerprint": fingerprint,
                "fingerprint_id": "__".join(str(v) for v in fingerprint.values())}

    store = History.open(store_url)
    for night, move in enumerate((1.0, 1.02, 0.99, 1.01)):
        store.append(a_run(night), [
            case("a.py::test_a", 100.0 * move), case("b.py::test_b", 50.0 * move),
            case("a.py::test_a", 70.0 * move, machine="other"),
            case("a.py::test_a", 30.0 * move, protocol="w1-s2"),
            *([case("c.py::test_c", 10.0, model="once")] if night == 0 else [])])
    series = machine_series(store, {**here, "model": "anything"}, "samples_per_s")
    assert sorted(len(points) for points in series) == [4, 4]
    assert {points[0].launches[0][0] for points in series} == {100.0, 50.0}
    model = from_history(series)
    assert model is not None and model.between_df == 6 and model.cases == 2
    assert "from the history's 4 nights of 2 cases" in model.describe()
    assert machine_series(store, {**here, "machine": "nobody"}, "samples_per_s") == []
