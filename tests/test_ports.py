"""The port contract's table (tests/ports.py) against the code: every model module of every
framework has a row, and every check names a test that holds it, marked as the row says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from ports import PORTS, Port

TESTS = Path(__file__).resolve().parent
MODELS = TESTS.parent / "pytest_dlperf" / "models"
CHECKS = ("shapes", "outputs", "trains", "amp", "ranks")


def test_every_port_module_has_a_row() -> None:
    """A new ``models/<model>/<framework>.py`` is a new port: it gets a row, with what it
    checks (or ``None``: no such check, a gap the table shows)."""
    modules = {(path.parent.name, path.stem) for path in MODELS.glob("*/*.py")
               if not path.stem.startswith("_")}
    rows = [(port.model, port.framework) for port in PORTS]
    assert len(set(rows)) == len(rows), "a port has two rows"
    assert modules == set(rows)


def _tests(path: Path) -> dict[str, str]:
    """Each test function of ``path`` by name, with its decorators' source."""
    return {node.name: " ".join(ast.unparse(d) for d in node.decorator_list)
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


@pytest.mark.parametrize("port", PORTS, ids=lambda port: port.id)
def test_every_check_names_a_test_that_holds_it_marked_as_the_row_says(port: Port) -> None:
    """A check's ``test`` (``file::name``) exists; where the row keeps it out of CI, that
    test carries the ``outside_ci`` mark (on itself or on a param)."""
    for check in filter(None, (getattr(port, name) for name in CHECKS)):
        module, name = check.test.split("::")
        tests = _tests(TESTS / module)
        assert name in tests, f"{port.id}: {check.test} names no test"
        if check.outside_ci:
            assert "outside_ci" in tests[name], f"{port.id}: {check.test} runs in CI"
