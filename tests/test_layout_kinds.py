"""Layout kinds as registered entries (issue 54): a kind registered from a test is spelled,
resolved, identified and put in the mesh like the built-in ones; ranks learn it from the layout's
JSON; an unknown kind is an error naming the registered ones."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_dlperf.core.parallel import (
    Kind,
    Layout,
    LayoutError,
    parse_layout,
    register_kind,
    registered,
    unregister_kind,
)
from pytest_dlperf.core.workload import Parts, Workload, WorkloadError, unknown_kinds
from pytest_dlperf.plugin.adapters import Adapter

pytestmark = pytest.mark.alone(
    "its recording takes the 1n2d cases' scaling efficiency from timings beside their 1n1d")


def _ratio(option: str) -> str | None:
    return None if re.fullmatch(r"r0\.\d+", option) else "a sample ratio: r0.<digits>"


# A classifier head split over the ranks, say: each rank trains on its own batch (data) and its
# dimension sits innermost in the mesh (after tp).
TOY = Kind("toy", 4, True, _ratio, help="a toy kind of this test")


@pytest.fixture
def toy() -> Iterator[Kind]:
    register_kind(TOY)
    yield TOY
    unregister_kind("toy")


@pytest.mark.usefixtures("toy")
def test_a_registered_kind_is_spelled_resolved_and_identified() -> None:
    layout = parse_layout("toy2xtp2").resolve(4)
    assert layout.id == "tp2xtoy2" and layout.fingerprint() == {"layout": "tp2xtoy2"}
    assert layout.degree("toy") == 2 and layout.kinds == ("tp", "toy")
    assert layout.data_parallel == 2 and layout.global_batch(8) == 16  # toy's ranks own batches
    assert layout.mesh() == [("tp", 2), ("toy", 2)]  # its mesh position: innermost
    assert [layout.coordinates(r)["toy"] for r in range(4)] == [0, 1, 0, 1]
    assert [layout.data_rank(r) for r in range(4)] == [0, 1, 0, 1]
    # A term option the kind takes is in the id (and so the fingerprint); one it does not, named.
    opted = parse_layout("toy-r0.1xtp2").resolve(8)
    assert opted.id == "tp2xtoy4-r0.1" and opted.options_of("toy") == ["r0.1"]
    with pytest.raises(LayoutError, match=r"unknown toy option 'fast' \(a sample ratio"):
        parse_layout("toy2-fast")
    # On one rank, named: its code on a mesh of one, its id saying so (as fsdp1 does).
    assert parse_layout("toy").resolve(1).id == "toy1"


@pytest.mark.usefixtures("toy")
def test_a_rank_learns_the_kind_from_the_layouts_json() -> None:
    """A rank process imports no module of the test's: the layout's JSON carries the kind."""
    sent = parse_layout("toy-r0.1xfsdp2").resolve(4).to_json()
    # ... with the module that registered it, which a rank imports for the kind's strategies
    assert sent["degrees"] == {"toy": 2} and sent["kinds"] == {"toy": {
        "mesh_position": 4, "data": True, "module": __name__,
        "path": str(Path(__file__).resolve().parent)}}
    code = ("import json, sys\nfrom pytest_dlperf.core.parallel import Layout\n"
            "layout = Layout.from_json(json.loads(sys.argv[1]))\n"
            "print(json.dumps([layout.id, layout.data_parallel, layout.mesh(),"
            " layout.options_of('toy')]))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(sent)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["fsdp2xtoy2-r0.1", 4, [["fsdp", 2], ["toy", 2]], ["r0.1"]]
    assert Layout.from_json(json.loads(json.dumps(sent))) == parse_layout(
        "toy-r0.1xfsdp2").resolve(4)


def test_an_unknown_kind_names_the_registered_ones(toy: Kind) -> None:
    with pytest.raises(LayoutError, match=r"no kind 'zed' is registered; .*\(dp, fsdp, tp, pp, "
                                          r"emb, pfc, toy\)"):
        parse_layout("zed2")
    # A workload naming a kind is made wherever its module is imported (a rank, before anything
    # registered the kind there); pytest's process checks the name before a case runs.
    typo = Workload("m", recipes={"torch": print}, layouts=("dp", "zed"))
    with pytest.raises(WorkloadError, match="unknown kind.s. zed; the registered kinds are dp, "
                                            "fsdp, tp, pp, emb, pfc, toy"):
        unknown_kinds(typo)
    unknown_kinds(Workload("m", recipes={"torch": print}, layouts=("dp", "toy")))


def test_a_kind_is_registered_once_and_built_in_kinds_stay() -> None:
    assert registered()[:4] == ("dp", "fsdp", "tp", "pp")
    with pytest.raises(LayoutError, match="registered already"):
        register_kind(Kind("tp", 9, True))
    with pytest.raises(LayoutError, match="other than 'x'"):
        register_kind(Kind("mix", 5, False))
    with pytest.raises(LayoutError, match="built in"):
        unregister_kind("pp")
    assert "toy" not in registered()  # the fixture's registration ended with its test


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "oneflow", "paddle", "mindspore",
                                       "mxnet", "jax"])
@pytest.mark.parametrize("compiled", [False, True])
def test_every_built_in_adapter_refuses_a_kind_it_has_no_code_for(toy: Kind, framework: str,
                                                                   compiled: bool) -> None:
    """OneFlow's and Paddle's checks once refused only what they listed: a new kind passed them
    and would have trained as plain data parallelism under its id."""
    for device in ("cpu", "cuda"):
        reason = Adapter.resolve(framework).layout_unavailable(("toy",), device, compiled)
        assert reason and ("toy" in reason or "data parallelism only" in reason
                           or "not ported" in reason), (framework, device, reason)


def page_files() -> dict[str, str]:
    """docs/adding-a-layout-kind.md's python blocks, by the file each names on its first line."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "adding-a-layout-kind.md").read_text()
    return dict(re.findall(r"```python\n# (\S+\.py)\n(.*?)```", page, re.S))


@pytest.mark.usefixtures("subprocess_env")
def test_the_docs_example_kind_trains_and_reports_under_torch(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's three files as written: the kind registered from the tests' conftest, its
    torch strategy applied in both ranks (a line each, from a wrapper this test adds), the cases
    measured under their own ids and fingerprints."""
    files = page_files()
    assert sorted(files) == ["conftest.py", "rep_kind.py", "test_my_model.py"]
    for name, text in files.items():
        (pytester.path / name).write_text(text)
    (pytester.path / "rep_kind.py").write_text(files["rep_kind.py"] + '''
import json, os

_apply = AverageByHooks.apply


def _logged(self, part):
    _apply(self, part)
    hooked = sum(p._post_accumulate_grad_hooks is not None for p in part.module.parameters())
    with open(os.environ["REP_LOG"], "a") as log:
        log.write(json.dumps([dist.get_rank(), part.mesh["rep"].size(), hooked]) + "\\n")


AverageByHooks.apply = _logged
''')
    log = pytester.path / "rep.log"
    monkeypatch.setenv("REP_LOG", str(log))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-protocol", "quick", "--dlperf-launches", "1",
        "--dlperf-repeats", "1", "--dlperf-unstable-cv", "100", "--devices-per-node", "2",
        "--dlperf-update-baselines", "--dlperf-json", "r.json", timeout=600)
    result.assert_outcomes(passed=4)
    cases = {b["name"]: b["extra_info"] for b in
             json.loads((pytester.path / "r.json").read_text())["benchmarks"]}
    assert sorted(cases) == ["test_mlp[1n1d-rep1]", "test_mlp[1n1d]", "test_mlp[1n2d-rep2]",
                             "test_mlp[1n2d]"], sorted(cases)
    rep2 = cases["test_mlp[1n2d-rep2]"]
    assert rep2["fingerprint"]["layout"] == "rep2" and rep2["global_batch"] == 2 * 128
    assert rep2["samples_per_s"] > 0 and "layout" not in cases["test_mlp[1n2d]"]["fingerprint"]
    # The strategy ran in each rank of each rep case (4 parameters hooked), on its dimension.
    lines = sorted(tuple(json.loads(line)) for line in log.read_text().splitlines())
    assert lines == [(0, 1, 4), (0, 2, 4), (1, 2, 4)], lines


def test_the_plans_earlier_names_still_work_for_a_release_and_warn() -> None:
    """Parts.plans replaces tp_plan, pipeline_split and fsdp_units: a recipe that gives the old
    names gets a FutureWarning naming the new spelling, and its plans read as before."""
    with pytest.warns(FutureWarning, match=r"Parts\(tp_plan=\.\.\., pipeline_split=\.\.\.\) is "
                                           r"deprecated .* Parts\(plans=\{'tp': \.\.\., "
                                           r"'pp': \.\.\.\}\)"):
        old = Parts(model=None, inputs=0, tp_plan={"q": "colwise"}, pipeline_split=["b.1"])
    assert old.plan("tp") == {"q": "colwise"} and old.plan("pp") == ["b.1"]
    assert old.plan("fsdp") is None and old.plan("toy") is None
    new = Parts(model=None, inputs=0, plans={"tp": {"q": "colwise"}, "toy": [0, 1]})
    assert new.plan("tp") == {"q": "colwise"} and new.plan("toy") == [0, 1]
    with pytest.raises(WorkloadError, match=r"gives the tp plan twice, as plans\['tp'\] and as "
                                            "tp_plan"):
        Parts(model=None, inputs=0, plans={"tp": {}}, tp_plan={"q": "colwise"})
