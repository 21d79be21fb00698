"""Each A/B side's ranks import the tests' repository's code from that side's own tree (issue 73):
a team's package installed editable (src layout; the editable installs setuptools, hatchling,
pdm and flit write, path .pth or import hook), a compiled extension the worktree lacks (refused,
or built with --dlperf-ab-build into an overlay of the head's environment), and the A/B header
saying where each side's code came from. A team's package needs an environment to be installed
into: an overlay of this interpreter's (``core.overlay``), never this one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from numpy_mlp import ADAPTER
from test_ab import AB, ab_of, commit, git

from pytest_dlperf.core import overlay, sources, worktrees
from pytest_dlperf.core.installs import probe_command
from pytest_dlperf.launch.importpath import PACKAGE

# (its A/B runs judge two sides' timings: marked alone, each; the rest judge none)
ALONE = pytest.mark.alone("its A/B verdicts judge two sides' timings")

SRC_LAYOUT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "mymodel"
version = "0.1"

[tool.setuptools.packages.find]
where = ["src"]
"""

# The team's model: its hidden layer HIDDEN times the input's width (4: as the README's MLP;
# 20: ~5x the work, numpy_mlp.SLOW's).
PACKAGE_INIT = '''\
"""A team's own model, built by its perf test's recipe."""

import numpy as np

HIDDEN = {hidden}


def make(ctx):
    rng = np.random.default_rng(ctx.seed + ctx.rank)
    width = int(ctx.sizes["width"])
    hidden = HIDDEN * width
    weights = [rng.standard_normal((width, hidden)) / np.sqrt(width),
               rng.standard_normal((hidden, 10)) / np.sqrt(hidden)]
    return weights, rng.standard_normal((ctx.batch_size, width)), rng.integers(0, 10,
                                                                               ctx.batch_size)
'''

TEST_MINE = '''\
import mymodel

from pytest_dlperf import SGD, Parts, Workload


def build(ctx):
    model, inputs, targets = mymodel.make(ctx)
    return Parts(model=model, inputs=inputs, targets=targets)


MLP = Workload(name="mlp", recipes={"numpy": build}, batch_size={"cpu": 128},
               sizes={"width": 256}, optimizer=SGD(lr_per_256=0.05, momentum=0.0))


def test_mine(cluster, amp, throughput_meter):
    throughput_meter.measure("mymodel.adapter", MLP)
'''


def write_package(repo: Path, hidden: int) -> None:
    """The team's repository: ``src/mymodel`` (its model and its framework adapter) and its
    perf test in ``tests/perf``."""
    (repo / "src" / "mymodel").mkdir(parents=True, exist_ok=True)
    (repo / "tests" / "perf").mkdir(parents=True, exist_ok=True)
    (repo / "pyproject.toml").write_text(SRC_LAYOUT)
    (repo / "src" / "mymodel" / "__init__.py").write_text(PACKAGE_INIT.format(hidden=hidden))
    (repo / "src" / "mymodel" / "adapter.py").write_text(ADAPTER)
    (repo / "tests" / "perf" / "test_mine.py").write_text(TEST_MINE)


@pytest.fixture
def team_env(tmp_path: Path) -> str:
    """An environment of the team's own: an overlay of this interpreter's (it sees torch,
    NumPy and pytest-dlperf as installed here), into which a test installs their package."""
    made = overlay.make(sys.executable, tmp_path / "team-env", "true", tmp_path)
    return made.python


def install_editable(python: str, repo: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                    "--no-deps", "--no-build-isolation", "-e", str(repo)], check=True,
                   capture_output=True, text=True)


def run_pytest(python: str, repo: Path, *args: str, timeout: float = 600
               ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    env.update(DLPERF_BUSY_THRESHOLD="1")
    return subprocess.run([python, "-m", "pytest", *args], cwd=repo, capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


@ALONE
def test_a_slower_commit_of_the_teams_own_package_fails_ab_and_the_header_says_so(
        tmp_path: Path, team_env: str) -> None:
    """The issue's case: a src-layout package installed editable, a commit that widens its
    layer; the base side's ranks import the base commit's package from its worktree."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("*.json\n*.egg-info/\n__pycache__/\n")
    write_package(repo, 4)
    base = commit(repo, "the team's model")
    write_package(repo, 20)
    commit(repo, "a wider hidden layer, in the package")
    install_editable(team_env, repo)
    done = run_pytest(team_env, repo, "tests/perf", *AB, "--dlperf-max-repeats", "6",
                      "--dlperf-ab", "HEAD~1", "--dlperf-json", "ab.json")
    out = done.stdout + done.stderr
    assert "A/B REGRESSION in tests/perf/test_mine.py::test_mine[1n1d-fp32]" in out, out[-4000:]
    ab = ab_of(repo / "ab.json")
    assert ab["outcome"] == "regression" and ab["base_commit"] == base
    tree = repo / ".pytest-dlperf" / "worktrees" / base
    # where each side's code came from, in the facts and under the A/B table
    assert ab["code"]["base"]["tree"] == str(tree)
    assert ab["code"]["base"]["taken"][:2] == ["tests/perf/ (the tests)",
                                               "src/ (on sys.path)"]
    assert "mymodel (mymodel 0.1, editable): src/mymodel" in ab["code"]["base"]["taken"]
    assert ab["code"]["head"]["tree"] == "this checkout"
    assert f"base's code, from {tree}: tests/perf/ (the tests); src/ (on sys.path); " \
           "mymodel (mymodel 0.1, editable): src/mymodel" in out, out[-3000:]
    # what each side's ranks imported, as they reported it
    (bench,) = json.loads((repo / "ab.json").read_text())["benchmarks"]
    assert bench["extra_info"]["environment"]["imports"]["mymodel"] == str(
        (repo / "src" / "mymodel").resolve())
    assert not tree.exists()  # the worktree went with the session


@ALONE
def test_a_built_extension_the_worktree_lacks_is_refused_or_built_with_ab_build(
        tmp_path: Path, team_env: str) -> None:
    """A package whose compiled extension is built into the checkout (ignored by git): the
    base's worktree lacks it, so its ranks would run without it; refused, naming the file and
    the option; with --dlperf-ab-build the base side is built in an overlay and its ranks
    import the worktree's build."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("*.json\n*.egg-info/\n__pycache__/\nbuild/\n*.so\n")
    write_package(repo, 4)
    (repo / "src" / "mymodel" / "_fast.c").write_text(EXTENSION)
    (repo / "setup.py").write_text(SETUP_PY)
    (repo / "src" / "mymodel" / "__init__.py").write_text(
        PACKAGE_INIT.format(hidden=4) + "\nfrom . import _fast  # the compiled part\n")
    commit(repo, "the team's model with a compiled part")
    install_editable(team_env, repo)
    assert list((repo / "src" / "mymodel").glob("_fast*.so"))
    refused = run_pytest(team_env, repo, "tests/perf", *AB, "--dlperf-ab", "HEAD",
                         "--dlperf-json", "refused.json")
    assert "built files this side's tree lacks (_fast." in refused.stdout, refused.stdout[-3000:]
    assert "build it with --dlperf-ab-build" in refused.stdout
    # refused before any launch: no figure of the case
    assert json.loads((repo / "refused.json").read_text())["benchmarks"] == []

    built = run_pytest(team_env, repo, "tests/perf", *AB, "--dlperf-ab", "HEAD",
                       "--dlperf-launches", "2", "--dlperf-max-repeats", "6",
                       "--dlperf-steps", "30", "--dlperf-warmup-steps", "10",
                       "--dlperf-ab-build",
                       "pip install -q --no-deps --no-build-isolation -e .",
                       "--dlperf-json", "built.json")
    out = built.stdout + built.stderr
    assert (repo / "built.json").exists(), out[-4000:]
    assert json.loads((repo / "built.json").read_text())["benchmarks"], out[-4000:]
    ab = ab_of(repo / "built.json")
    assert "built by `pip install -q --no-deps --no-build-isolation -e .` in an overlay" \
        in ab["code"]["base"]["built"], out[-3000:]
    assert "built by `pip install" in out
    assert not list((repo / ".pytest-dlperf").glob("ab-*"))  # the overlay went with the session


EXTENSION = """\
#include <Python.h>
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fast", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__fast(void) { return PyModule_Create(&module); }
"""
SETUP_PY = """\
from setuptools import Extension, setup
setup(ext_modules=[Extension("mymodel._fast", ["src/mymodel/_fast.c"])])
"""


BACKENDS = {
    "setuptools-flat": ('[build-system]\nrequires = ["setuptools>=61"]\n'
                        'build-backend = "setuptools.build_meta"\n', "flat"),
    "setuptools-src": ('[build-system]\nrequires = ["setuptools>=61"]\n'
                       'build-backend = "setuptools.build_meta"\n'
                       '[tool.setuptools.packages.find]\nwhere = ["src"]\n', "src"),
    "hatchling": ('[build-system]\nrequires = ["hatchling"]\n'
                  'build-backend = "hatchling.build"\n', "src"),
    "hatchling-exact": ('[build-system]\nrequires = ["hatchling", "editables"]\n'
                        'build-backend = "hatchling.build"\n'
                        '[tool.hatch.build]\ndev-mode-exact = true\n', "src"),
    "pdm": ('[build-system]\nrequires = ["pdm-backend"]\nbuild-backend = "pdm.backend"\n',
            "src"),
    "flit": ('[build-system]\nrequires = ["flit_core"]\n'
             'build-backend = "flit_core.buildapi"\n', "src"),
}


def test_every_backends_editable_install_is_taken_from_the_sides_tree(tmp_path: Path) -> None:
    """Each backend's editable install (a path .pth, setuptools' import hook, editables'
    redirector) in an environment of its own: the base side's import paths make the package
    import from the base's worktree, in a fresh interpreter of that environment."""
    env = overlay.make(sys.executable, tmp_path / "env", "true", tmp_path).python
    repos = {}
    for backend, (system, layout) in BACKENDS.items():
        name = "pk_" + backend.replace("-", "_")
        repo = tmp_path / backend
        folder = repo / "src" / name if layout == "src" else repo / name
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("WHERE = 'head'\n")
        (repo / "pyproject.toml").write_text(
            f'{system}[project]\nname = "{name}"\nversion = "0.1"\ndescription = "x"\n')
        git(repo, "init", "-q")
        commit(repo, "the package")
        (folder / "__init__.py").write_text("WHERE = 'changed in the checkout'\n")
        install_editable(env, repo)
        repos[name] = repo
    report = json.loads(subprocess.run(probe_command(env, str(PACKAGE.parent)), cwd="/",
                                       capture_output=True, text=True, check=True).stdout)
    for name, repo in repos.items():
        trees = worktrees.Worktrees(repo)
        tree = trees.get(worktrees.resolve(repo, "HEAD"))
        try:
            side = sources.map_side(report, sources.Checkouts(worktrees.checkouts(repo)), tree,
                                    tmp_path / f"links-{name}")
            assert not side.lacking, side.lacking
            where = subprocess.run(
                [env, "-c", f"import {name}; print({name}.WHERE, {name}.__file__)"], cwd="/",
                env={**os.environ, "PYTHONPATH": os.pathsep.join(side.import_paths)},
                capture_output=True, text=True, check=True).stdout.split()
            assert where[0] == "head", (name, where, side)
            assert Path(where[1]).resolve().is_relative_to(tree.resolve()), (name, where)
            assert side.expected[name] == str(Path(where[1]).resolve().parent)
        finally:
            trees.close()


def test_a_rank_side_that_imported_from_another_tree_fails_the_case(tmp_path: Path) -> None:
    """The check of what a side's ranks imported: a module from elsewhere than its tree fails
    the case naming it; from within the mapped folder passes; a rank side from before the
    report (this plugin's own, at an old commit) is not checked."""
    from pytest_dlperf.plugin.abcode import SidesCode

    code = SidesCode(tmp_path, tmp_path / "scratch")
    mapped = tmp_path / "tree" / "src" / "mymodel"
    side = sources.Side(tmp_path / "tree", expected={"mymodel": str(mapped)})
    with pytest.raises(pytest.fail.Exception, match=(
            rf"A/B base side \(x\): its ranks imported mymodel from /elsewhere/mymodel "
            rf"\(expected {mapped}\)")):
        code.check(side, {"imports": {"mymodel": "/elsewhere/mymodel"}}, "base side (x)")
    code.check(side, {"imports": {"mymodel": str(mapped / "layers.py")}}, "base side (x)")
    code.check(side, {"framework_version": "1.0"}, "base side (x)")


def test_a_base_whose_rank_side_cannot_read_the_heads_spec_is_refused_by_name(
        tmp_path: Path) -> None:
    """This plugin's own repository at another commit, whose rank spec lacks a field the head
    writes (the plugin's package, its RankSpec without ``phase_steps``, as before phases
    were): a case that uses the field is refused naming it; one that leaves it at its default
    (the file a rank reads leaves such fields out) is read alike."""
    from dataclasses import replace

    from pytest_dlperf.core.protocol import Protocol
    from pytest_dlperf.core.spec import OptimizerSpec, RankSpec
    from pytest_dlperf.plugin.abcode import SidesCode

    tree = tmp_path / "old"
    shutil.copytree(PACKAGE, tree / "pytest_dlperf",
                    ignore=shutil.ignore_patterns("__pycache__"))
    spec_py = tree / "pytest_dlperf" / "core" / "spec.py"
    field = "    phase_steps: int = 0\n"
    assert field in spec_py.read_text(), "RankSpec.phase_steps changed: update this test"
    spec_py.write_text(spec_py.read_text().replace(field, ""))
    side = sources.Side(tree, import_paths=[str(tree)],
                        expected={"pytest_dlperf": str(tree / "pytest_dlperf")})
    assert side.plugin_mapped
    spec = RankSpec(framework="torch", model="mlp", protocol=Protocol(5, 10, 3), batch_size=8,
                    optimizer=OptimizerSpec(lr=0.1))
    code = SidesCode(tmp_path, tmp_path / "scratch")
    assert code.spec_problem(side, sys.executable, spec) is None
    problem = code.spec_problem(side, sys.executable, replace(spec, phase_steps=3))
    assert problem is not None and "cannot read the head's spec" in problem
    assert "phase_steps" in problem, problem


def test_an_ab_python_that_names_no_interpreter_for_the_case_is_refused(
        tmp_path: Path) -> None:
    """--dlperf-ab-python FRAMEWORK=PATH for another framework than the case's, and no REV: its
    base side would be the head itself, which would pass whatever changed; refused by name."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    write_package(repo, 4)
    commit(repo, "the team's model")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    env["PYTHONPATH"] = str(repo / "src")
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/perf", *AB,
                           f"--dlperf-ab-python=oneflow={sys.executable}"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert ("mymodel.adapter's ranks would run the head's code under the head's interpreter"
            in done.stdout), done.stdout[-3000:]
    assert "--dlperf-ab-python names none for them" in done.stdout
