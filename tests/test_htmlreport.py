"""The history's HTML page (python -m pytest_dlperf html): built from a real store, opened
in a real headless Chromium (Debian's chromium, driven by Playwright), which must show it with no
console error and every figure drawn. Skipped, saying why, where Chromium or Playwright is
missing (.ci/run installs both)."""

from __future__ import annotations

import datetime as dt
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_dlperf.store.history import History

pytest.importorskip("sqlalchemy")
pytest.importorskip("matplotlib")
REPO = Path(__file__).resolve().parents[1]
RESNET = "perf_tests/test_resnet50_{fw}.py::test_resnet50_v15[{topo}-fp32-eager]"


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium on this machine (apt-get install chromium; .ci/run installs it)")


def fingerprint(fw: str, nodes: int, devices: int) -> dict[str, object]:
    return {"device_type": "cpu", "device_model": "AMD EPYC", "nodes": nodes,
            "devices_per_node": devices, "framework": fw, "framework_version": "1.0",
            "precision": "fp32", "model": "resnet50_v1.5", "batch_size": 2, "image_size": 64,
            "protocol": "quick", "python": "3.11", "machine": "box",
            "threads_per_worker": 2 // (nodes * devices) or 1}


def seed(url: str, nights: int = 24, step_at: int = 18) -> History:
    """Nights of two frameworks on 1n1d, 1n2d and 2n2d: torch's 1n1d case 8% slower from night
    ``step_at`` on (its commit "bad..."), nothing else changing."""
    rng = random.Random(4)
    store = History.open(url)
    speed = {"torch": 14.0, "tensorflow": 9.0}
    scale = {(1, 1): 1.0, (1, 2): 1.7, (2, 2): 3.1}
    start = dt.datetime(2026, 10, 1, 3, tzinfo=dt.timezone.utc)
    for n in range(nights):
        commit = ("bad" if n == step_at else f"{n:03x}") + "0" * 37
        cases = []
        for fw, base in speed.items():
            for (nodes, devices), factor in scale.items():
                topo = f"{nodes}n{devices}d"
                level = base * factor * (0.92 if fw == "torch" and topo == "1n1d"
                                         and n >= step_at else 1.0)
                launches = [[level * (1 + rng.gauss(0, 0.01)) for _ in range(2)]
                            for _ in range(3)]
                fp = fingerprint(fw, nodes, devices)
                from pytest_dlperf.core.topology import fingerprint_id

                cases.append({"case_key": RESNET.format(fw=fw, topo=topo), "fingerprint": fp,
                              "fingerprint_id": fingerprint_id(fp), "framework": fw,
                              "model": "resnet50_v1.5", "unit": "images", "verdict": "pass",
                              "baseline_action": "recorded" if n == 0 else None,
                              "metrics": {"samples_per_s": launches}})
        store.append({"started_at": start + dt.timedelta(days=n), "commit_id": commit,
                      "branch": "main", "dirty": False, "host": "runner-1", "machine": "box",
                      "plugin_version": "0", "protocol": {"name": "quick"}}, cases)
    return store


def build(url: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_dlperf", "html", url, "-o",
                           str(out), "--title", "nightly"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "history.db")
    return str(request.getfixturevalue("postgres_url"))


def test_the_page_has_every_case_its_step_and_the_scaling_and_framework_figures(
        store_url: str, tmp_path: Path) -> None:
    seed(store_url)
    out = tmp_path / "page"
    done = build(store_url, out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {out / 'index.html'}"
    page = (out / "index.html").read_text()
    for fw in ("torch", "tensorflow"):
        for topo in ("1n1d", "1n2d", "2n2d"):
            assert RESNET.format(fw=fw, topo=topo) in page
    # the one real step, with its commit, marked on its own trend and listed under it
    assert len(re.findall(r"images/s dropped [78]\.\d% [^<]* at commit bad0000 \(run 19, night "
                          r"of 2026-10-19\)", page)) == 2  # in "Needs a look" and under its trend
    assert page.count("sits after a step for the worse") == 1
    trends = sorted((out / "plots").glob("trend-*.svg"))
    assert len(trends) == 6
    marked = [p for p in trends if "at bad0000" in p.read_text()]
    assert len(marked) == 1 and "torch" in marked[0].name and "1n1d" in marked[0].name
    # scaling per model and framework, the framework comparison, DLPerf's table with speedups
    assert sorted(p.name for p in (out / "plots").glob("scaling-*.svg")) == [
        "scaling-resnet50-v1-5-tensorflow.svg", "scaling-resnet50-v1-5-torch.svg"]
    assert [p.name for p in (out / "plots").glob("frameworks-*.svg")] == [
        "frameworks-resnet50-v1-5.svg"]
    assert re.search(r"<td>2n2d</td><td>fp32, batch 2</td><td>test_resnet50_v15\[2n2d-fp32-eager\]"
                     r"</td><td>27\.\d\d \(3\.\d\dx\)</td>", page)
    # self-contained: every reference is a file in the folder, nothing from the network
    refs = re.findall(r'(?:src|href)="([^"#][^"]*)"', page)
    assert refs and all((out / ref).is_file() for ref in refs)
    # "Needs a look" links to the one case that sits after its step, which comes first
    (anchor,) = re.findall(r'<h2>Needs a look</h2>\s*<ul><li><a href="#([^"]+)">', page)
    assert f'id="{anchor}"' in page and "torch" in anchor and "1n1d" in anchor
    assert page.index(f'id="{anchor}"') < page.index("test_resnet50_tensorflow.py::")
    assert "http://" not in page and "https://" not in page


def test_bad_stores_are_refused_by_name_and_nothing_is_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "history.db"
    done = build(str(missing), tmp_path / "page")
    assert done.returncode == 2
    assert f"error: {missing}: no such file; give the path or URL that --dlperf-history " \
           "wrote to" in done.stderr
    assert not missing.parent.exists() and not (tmp_path / "page").exists()
    other = tmp_path / "other.db"
    import sqlite3

    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    done = build(str(other), tmp_path / "page")
    assert done.returncode == 2 and "holds no pytest-dlperf history" in done.stderr


def test_headless_chromium_shows_the_page_with_no_console_error(tmp_path: Path) -> None:
    browser_path = chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    url = str(tmp_path / "history.db")
    seed(url)
    out = tmp_path / "page"
    assert build(url, out).returncode == 0
    problems: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path,
                                    args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
        page.goto((out / "index.html").as_uri(), wait_until="load")
        images = page.eval_on_selector_all(
            "img", "imgs => imgs.map(i => [i.getAttribute('src'), i.complete, i.naturalWidth,"
                   " i.getBoundingClientRect().height])")
        title = page.title()
        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert problems == []
    assert title == "nightly"
    assert len(images) == 6 + 2 + 1  # trends, scaling, frameworks
    assert all(complete and width > 100 and height > 100
               for _, complete, width, height in images), images
    assert shot.stat().st_size > 50_000


def test_scaling_lines_start_at_the_one_device_case_whatever_link_the_nodes_had() -> None:
    """One device has no link; 2 nodes at 10 Gbit/s and at 1 Gbit/s are two lines from it."""
    from pytest_dlperf.report.page import dlperf_tables, scaling_groups
    from pytest_dlperf.report.series import Series
    from pytest_dlperf.store.history import Point

    def series(nodes: int, median: float, link: str | None) -> Series:
        fp = {**fingerprint("torch", nodes, 1), **({"link": link} if link else {})}
        point = Point(None, dt.datetime(2026, 11, 25), None, None, "h", "pass", [[median]])
        return Series(f"perf/test_r.py::test_r[{nodes}n1d]", f"id-{nodes}-{link}", fp, "torch",
                      "resnet50_v1.5", "images", [point])

    all_series = [series(1, 10.0, None), series(2, 18.0, "10gbit"), series(2, 12.0, "1gbit")]
    lines = scaling_groups(all_series)[("resnet50_v1.5", "torch")]
    assert lines == {"test_r: fp32, batch 2, link 10gbit": [(1, 1.0), (2, 1.8)],
                     "test_r: fp32, batch 2, link 1gbit": [(1, 1.0), (2, 1.2)]}
    table = dlperf_tables(all_series)
    assert "18.00 (1.80x)" in table and "12.00 (1.20x)" in table


def two_tests_of_tiny_gpt(tmp_path: Path) -> History:
    """A real SQLite history of two torch tests training tiny_gpt on 1n1d and 1n2d with one
    fingerprint per topology (435.14 and 424.63 tokens/s on 1n2d), and tensorflow's test of the
    first name on 1n2d only."""
    from pytest_dlperf.core.topology import fingerprint_id

    store = History.open(f"sqlite:///{tmp_path / 'history.sqlite'}")
    figures = {("torch", "test_tiny_gpt", "1n1d"): 250.0,
               ("torch", "test_tiny_gpt", "1n2d"): 435.14,
               ("torch", "test_tiny_gpt_packed", "1n1d"): 200.0,
               ("torch", "test_tiny_gpt_packed", "1n2d"): 424.63,
               ("tensorflow", "test_tiny_gpt", "1n2d"): 300.0}
    cases = []
    for (fw, test, topo), figure in figures.items():
        fp = {**fingerprint(fw, 1, int(topo[2])), "model": "tiny_gpt"}
        cases.append({"case_key": f"perf/test_gpt_{fw}.py::{test}[{topo}-fp32]",
                      "fingerprint": fp, "fingerprint_id": fingerprint_id(fp), "framework": fw,
                      "model": "tiny_gpt", "unit": "tokens", "verdict": "pass",
                      "baseline_action": None, "metrics": {"samples_per_s": [[figure]]}})
    store.append({"started_at": dt.datetime(2026, 11, 25, 3, tzinfo=dt.timezone.utc),
                  "commit_id": "a" * 40, "branch": "main", "dirty": False, "host": "runner-1",
                  "machine": "box", "plugin_version": "0", "protocol": {"name": "quick"}}, cases)
    return store


def test_two_tests_of_one_workload_and_topology_each_get_their_cell(tmp_path: Path) -> None:
    """The Tables section keys its cells by test: two tests training the same workload on the
    same topology and precision (the same fingerprint) are two rows, each with its own figure
    and its speedup over its own 1n1d case; a test of another framework with the same name
    stays beside it in its column."""
    from pytest_dlperf.report.page import dlperf_tables
    from pytest_dlperf.report.series import load

    table = dlperf_tables(load(two_tests_of_tiny_gpt(tmp_path)))
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)
            if "<td>" in row]
    assert sorted(rows) == sorted([
        ["1n1d", "fp32, batch 2", "test_tiny_gpt[1n1d-fp32]", "-", "250.00"],
        ["1n1d", "fp32, batch 2", "test_tiny_gpt_packed[1n1d-fp32]", "-", "200.00"],
        ["1n2d", "fp32, batch 2", "test_tiny_gpt[1n2d-fp32]", "300.00", "435.14 (1.74x)"],
        ["1n2d", "fp32, batch 2", "test_tiny_gpt_packed[1n2d-fp32]", "-", "424.63 (2.12x)"],
    ]), table


def test_two_tests_of_one_workload_and_topology_each_get_their_line_and_bar(
        tmp_path: Path) -> None:
    """The Scaling lines and the Frameworks bars are keyed by test as the tables are: each of
    two tests training the same workload on the same topology and precision keeps its figure,
    a line from its own 1n1d case and a bar beside the other framework's test of its name; and
    each is drawn in the page's figures."""
    from pytest_dlperf.report.page import comparison_groups, scaling_groups, write
    from pytest_dlperf.report.series import load

    store = two_tests_of_tiny_gpt(tmp_path)
    all_series = load(store)
    # tensorflow has no 1n1d case to scale from: no line, as its table cell has no speedup
    assert scaling_groups(all_series) == {("tiny_gpt", "torch"): {
        "test_tiny_gpt: fp32, batch 2": [(1, 1.0), (2, pytest.approx(435.14 / 250.0))],
        "test_tiny_gpt_packed: fp32, batch 2": [(1, 1.0), (2, pytest.approx(424.63 / 200.0))]}}
    assert comparison_groups(all_series) == {"tiny_gpt": {
        "1n1d fp32, batch 2\ntest_tiny_gpt[1n1d-fp32]": {"torch": 250.0},
        "1n1d fp32, batch 2\ntest_tiny_gpt_packed[1n1d-fp32]": {"torch": 200.0},
        "1n2d fp32, batch 2\ntest_tiny_gpt[1n2d-fp32]": {"tensorflow": 300.0, "torch": 435.14},
        "1n2d fp32, batch 2\ntest_tiny_gpt_packed[1n2d-fp32]": {"torch": 424.63}}}

    out = tmp_path / "page"
    write(store, out)
    scaling = (out / "plots" / "scaling-tiny-gpt-torch.svg").read_text()
    assert "test_tiny_gpt: fp32, batch 2" in scaling
    assert "test_tiny_gpt_packed: fp32, batch 2" in scaling
    bars = (out / "plots" / "frameworks-tiny-gpt.svg").read_text()
    for test in ("test_tiny_gpt[1n1d-fp32]", "test_tiny_gpt_packed[1n1d-fp32]",
                 "test_tiny_gpt[1n2d-fp32]", "test_tiny_gpt_packed[1n2d-fp32]"):
        assert test in bars
    assert sorted(p.name for p in (out / "plots").glob("[sf]*.svg")) == [
        "frameworks-tiny-gpt.svg", "scaling-tiny-gpt-torch.svg"]


def test_phases_keep_the_steps_order_over_runs_that_cut_the_step_differently() -> None:
    from pytest_dlperf.core.phases import Phases
    from pytest_dlperf.report.phaseplot import phase_order, stacks

    eager = Phases({"data": 0.01, "forward": 0.04, "backward": 0.1, "rest": 0.002},
                   ["data", "forward", "backward", "rest"])
    compiled = Phases({"data": 0.01, "forward+backward": 0.12, "rest": 0.001,
                       "exposed communication": 0.05},
                      ["data", "forward+backward", "rest", "exposed communication"])
    assert phase_order([eager, None, compiled]) == [
        "data", "forward+backward", "forward", "backward", "rest", "exposed communication"]
    assert stacks([eager, None, compiled]) == {
        "data": [0.01, 0.0, 0.01], "forward+backward": [0.0, 0.0, 0.12],
        "forward": [0.04, 0.0, 0.0], "backward": [0.1, 0.0, 0.0], "rest": [0.002, 0.0, 0.001],
        "exposed communication": [0.0, 0.0, 0.05]}
    assert phase_order([None, None]) == [] and stacks([]) == {}


def test_the_page_stacks_each_runs_phases_where_any_run_of_a_case_has_them(
        tmp_path: Path) -> None:
    """A case whose runs ran diagnostic steps gets a stacked bar plot of them under its trend
    (a bar per run, the phases in step order, in ms per step); a case none of whose runs did,
    none."""
    from pytest_dlperf.core.phases import Phases
    from pytest_dlperf.report.page import write
    from pytest_dlperf.report.series import load

    store = two_tests_of_tiny_gpt(tmp_path)  # its one run: no phases
    phased = "perf/test_gpt_torch.py::test_tiny_gpt[1n1d-fp32]"
    (key,) = [k for k in store.keys() if k["case_key"] == phased]
    order = ["data", "forward", "backward", "optimizer", "rest"]
    for night, backward in ((1, 0.1), (2, 0.13)):
        phases = Phases(dict(zip(order, [0.005, 0.04, backward, 0.03, 0.001])), order)
        store.append({"started_at": dt.datetime(2026, 11, 25 + night, 3, tzinfo=dt.timezone.utc),
                      "commit_id": f"{night}" * 40, "branch": "main", "dirty": False,
                      "host": "runner-1", "machine": "box", "plugin_version": "0",
                      "protocol": {"name": "quick"}},
                     [{"case_key": phased, "fingerprint": key["fingerprint"],
                       "fingerprint_id": key["fingerprint_id"], "framework": "torch",
                       "model": "tiny_gpt", "unit": "tokens", "verdict": "pass",
                       "phases": phases.to_json(), "metrics": {"samples_per_s": [[250.0]]}}])
    (series,) = [s for s in load(store) if s.case == phased]
    assert [p.seconds["backward"] if p else None for p in series.phases] == [None, 0.1, 0.13]
    out = tmp_path / "page"
    write(store, out)
    (plot,) = (out / "plots").glob("phases-*.svg")
    assert "test-tiny-gpt-1n1d-fp32" in plot.name
    svg = plot.read_text()
    assert "ms per step" in svg
    legend = [svg.index(f">{name}<") for name in order]  # stacked in step order, bottom up
    assert legend == sorted(legend, reverse=True)  # its legend top down, as the bars
    page = (out / "index.html").read_text()
    assert f'<img src="plots/{plot.name}" alt="phases of {phased} per run">' in page
    assert page.count("alt=\"phases of") == 1
