"""How a case ends on the pytest side: a failure with its message alone, a warning of the
plugin's own class, and the verdict shared with every rank in external mode."""

from __future__ import annotations

from typing import NoReturn

import pytest

from ..launch import Launcher
from ..verdict.decide import Decision


class DLPerfWarning(pytest.PytestWarning):
    """A case passed but something about its figures deserves a look."""


def fail(message: str) -> NoReturn:
    """Fail the test with ``message`` alone: no traceback, and not the error being handled
    (which the message already says) printed again above it."""
    try:
        pytest.fail(message, pytrace=False)
    except pytest.fail.Exception as failed:
        raise failed from None


def conclude(node: pytest.Item, decision: Decision, launcher: Launcher, timeout_s: float) -> None:
    """Apply rank 0's decision: warnings attached to the test, a failure failing it; every
    other rank of an externally launched job is told the outcome."""
    for warning in decision.warnings:
        node.warn(DLPerfWarning(warning))
    if decision.failure is not None:
        launcher.share_outcome({"status": "failed", "message": decision.failure}, timeout_s)
        pytest.fail(decision.failure, pytrace=False)
    launcher.share_outcome({"status": "passed", "message": ""}, timeout_s)


def follow_rank0(launcher: Launcher, timeout_s: float) -> None:
    """A rank other than 0 in external mode: take rank 0's word for the case's outcome."""
    outcome = launcher.share_outcome({}, timeout_s)
    if outcome["status"] == "failed":
        pytest.fail(f"pytest-dlperf (rank 0's verdict): {outcome['message']}", pytrace=False)
