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
