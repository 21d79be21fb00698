"""The package's house: which folder may import which, no import circle, the rank side free of
pytest, and modules and functions short enough to read. Read from the code itself: every import,
at module level or inside a function, as pytest's own ``testing/test_meta.py`` checks its modules
one fresh interpreter at a time."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_dlperf"

# Folder -> the folders its modules may import (its own included). Bottom to top; "face" is the
# package's __init__ (the public API: the workload records of core), "cli" the command line.
ALLOWED: dict[str, set[str]] = {
    "face": {"face", "core"},
    "core": {"core"},
    "frameworks": {"core", "frameworks"},
    "models": {"core", "models"},
    "rank": {"core", "frameworks", "models", "rank"},
    # The external launcher runs the rank in pytest's own process (pytest is a rank there).
    "launch": {"core", "frameworks", "rank", "launch"},
    "store": {"face", "core", "store"},
    "verdict": {"core", "store", "verdict"},
    "report": {"core", "store", "verdict", "report"},
    "plugin": {"face", "core", "frameworks", "models", "rank", "launch", "store", "verdict",
               "report", "plugin"},
    # `dlperf slurm` starts and stops a local Slurm cluster (launch.localslurm)
    "cli": {"core", "launch", "store", "verdict", "report", "plugin", "cli"},
}
# The rank side: what runs inside a training rank, under any interpreter, without pytest.
RANK_SIDE = ("core", "frameworks", "models", "rank")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "face"
    if (parts[1] in ("cli", "__main__", "bisect", "nightly")
            or module == "pytest_dlperf.report.__main__"):
        return "cli"  # the command line (bisect: its command), the `report` module's shim
    return parts[1]


def imports(path: Path) -> set[str]:
    """Every module of the package that ``path`` imports, wherever the import stands."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import x`: x may be a module of its own (then the package's face is only
            # passed through, as for every submodule); else it is a name the target defines
            folder = PACKAGE.parent / target.replace(".", "/")
            for alias in node.names:
                if (folder / f"{alias.name}.py").exists() or (folder / alias.name).is_dir():
                    found.add(f"{target}.{alias.name}")
                else:
                    found.add(target)
    return {m for m in found if m == "pytest_dlperf" or m.startswith("pytest_dlperf.")}


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        # importing a.b.c imports the packages a.b and a too: count only the module named
        edges[name] = {m for m in imports(path) if m in modules and m != name}
    return edges


def test_imports_run_one_way_between_the_folders() -> None:
    wrong = [f"{src} ({layer(src)}) imports {dst} ({layer(dst)})"
             for src, targets in graph().items() for dst in sorted(targets)
             if layer(dst) not in ALLOWED[layer(src)]]
    assert not wrong, "imports against the layers (docs/layout.md):\n" + "\n".join(wrong)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_counting_imports_inside_functions() -> None:
    # Package faces (__init__) that import their own modules are not circles by themselves;
    # a module importing its package's face back is.
    assert circles(graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Imports every module it is given with `import pytest` (and the pytest side) made to fail, and
# says which could not be imported and why, and whether pytest got in anyway.
GUARD = r"""
import importlib, importlib.abc, json, sys

class NoPytest(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pytest", "_pytest", "pluggy") or \
                name.startswith("pytest_dlperf.plugin"):
            raise ImportError(f"the rank side imported {name}")
        return None

sys.meta_path.insert(0, NoPytest())
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"failed": failed, "pytest_loaded": [m for m in sys.modules
                  if m.split(".")[0] in ("pytest", "_pytest")]}))
"""


def guarded_import(modules: list[str], path: Path = PACKAGE.parent) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", GUARD, *modules], capture_output=True,
                          text=True, cwd=path, timeout=300, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def rank_side_modules() -> list[str]:
    return sorted(module_name(p) for folder in RANK_SIDE for p in (PACKAGE / folder).rglob("*.py"))


def test_the_rank_side_imports_without_pytest() -> None:
    modules = rank_side_modules()
    assert "pytest_dlperf.rank.worker" in modules and "pytest_dlperf.frameworks.torch" in modules
    assert guarded_import(modules) == {"failed": {}, "pytest_loaded": []}


def test_the_guard_catches_a_rank_side_module_that_imports_pytest(tmp_path: Path) -> None:
    """The same check on a copy of the package where one rank-side module imports pytest."""
    import shutil

    copy = tmp_path / "pytest_dlperf"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    timing = copy / "rank" / "timing.py"
    timing.write_text(timing.read_text().replace("from __future__ import annotations\n",
                                                 "from __future__ import annotations\n\nimport pytest\n", 1))
    result = guarded_import(["pytest_dlperf.rank.timing", "pytest_dlperf.rank.worker"], tmp_path)
    failed = result["failed"]
    assert isinstance(failed, dict) and set(failed) == {"pytest_dlperf.rank.timing",
                                                         "pytest_dlperf.rank.worker"}
    assert "the rank side imported pytest" in failed["pytest_dlperf.rank.timing"]


# Longer than the house's ~60 lines, and why.
LONG_FUNCTIONS = {
    # Model definitions in functions so the framework is imported only in the rank: each is a
    # list of small layer classes, not one long procedure.
    "pytest_dlperf/models/bert/oneflow.py::_modules",
    "pytest_dlperf/models/bert/tensorflow.py::_layer_classes",
    "pytest_dlperf/models/gpt/torch.py::_classes",
    # One dict literal: the results entry's fields, one a line.
    "pytest_dlperf/report/results.py::benchmark_entry",
    # The adapters' trainers set up a framework in one visible sequence (process group, device,
    # model, optimizer, compiler); split, the order between the steps would hide.
    "pytest_dlperf/frameworks/tensorflow/__init__.py::__init__",
    "pytest_dlperf/frameworks/oneflow/__init__.py::__init__",
    # torch's too, since layouts (issue 40): the data-parallel and the sharded set-up side by
    # side, the strategies themselves in frameworks/torch/parallel.py.
    "pytest_dlperf/frameworks/torch/__init__.py::__init__",
}


def test_modules_and_functions_are_short_enough_to_read() -> None:
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent).as_posix()
        tree = ast.parse(path.read_text())
        if tree.body and tree.body[-1].end_lineno and tree.body[-1].end_lineno > 400:
            long_modules.append(f"{where}: {tree.body[-1].end_lineno} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60 and f"{where}::{node.name}" not in LONG_FUNCTIONS:
                    long_functions.append(f"{where}::{node.name}: {length} lines")
    assert long_modules == [] and long_functions == []


def test_library_modules_have_no_main_block_but_the_process_entry_points() -> None:
    entries = {"pytest_dlperf/rank/worker.py", "pytest_dlperf/rank/flops.py",
               "pytest_dlperf/rank/gemm.py",
               "pytest_dlperf/launch/local/netns.py", "pytest_dlperf/launch/onehost/userhosts.py",
               "pytest_dlperf/__main__.py",
               "pytest_dlperf/report/__main__.py"}
    found = {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*.py")
             if '__name__ == "__main__"' in p.read_text()}
    assert found <= entries, found - entries


# The packages whose docstring is their table of contents (issue 54: core's named 9 of its 17
# modules): every module is named there, ``like_this``. The other packages are a module per
# framework, model, launcher or pytest concern, listed by their folder.
INDEXED = ("core", "verdict", "rank", "store", "report")


def test_a_package_docstring_names_every_module_of_its_package() -> None:
    unnamed = {}
    for package in INDEXED:
        folder = PACKAGE / package
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
        missing = [name for name in modules if f"``{name}``" not in doc]
        if missing:
            unnamed[package] = missing
    assert unnamed == {}
