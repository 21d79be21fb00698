"""Checks on this suite itself: marks only where pytest reads them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("path", sorted(TESTS.rglob("test_*.py")), ids=lambda p: p.name)
def test_marks_sit_on_tests_not_on_helpers(path: Path) -> None:
    """``@pytest.mark.usefixtures`` (any mark) on a helper function does nothing: pytest reads
    marks on tests and fixtures only, so the helper runs without what the mark promised."""
    misplaced = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("test"):
            continue
        for decorator in node.decorator_list:
            text = ast.unparse(decorator)
            if text.startswith("pytest.mark."):
                misplaced.append(f"{node.name}: @{text}")
    assert misplaced == []


@pytest.mark.parametrize("path", sorted(TESTS.rglob("test_*.py")), ids=lambda p: p.name)
def test_suite_only_marks_are_not_in_the_code_a_test_writes(path: Path) -> None:
    """``alone`` and ``outside_ci`` are this suite's own marks (pyproject.toml): in the code a
    test writes for a child run or a process of its own (a string), they mark nothing here and
    break or warn there."""
    written = [node.value for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    marks = [f"pytest.mark.{name}(" for name in ("alone", "outside_ci")]
    assert [text for text in written if any(mark in text for mark in marks)] == []


def test_the_longest_modules_named_first_are_modules_of_the_first_pass() -> None:
    """conftest's LONGEST_FIRST orders scripts/test's first pass: a name left behind by a
    rename would order nothing, silently; a module of the second pass, nothing either."""
    (LONGEST_FIRST,) = [ast.literal_eval(node.value) for node in
                        ast.parse((TESTS / "conftest.py").read_text()).body
                        if isinstance(node, ast.Assign)
                        and any(getattr(t, "id", "") == "LONGEST_FIRST" for t in node.targets)]
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    for name in LONGEST_FIRST:
        path = TESTS / name
        assert path.exists(), f"tests/conftest.py's LONGEST_FIRST names {name}: no such module"
        module_marks = [ast.unparse(node.value) for node in ast.parse(path.read_text()).body
                        if isinstance(node, ast.Assign)
                        and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)]
        assert not any(".alone(" in marks for marks in module_marks), name
