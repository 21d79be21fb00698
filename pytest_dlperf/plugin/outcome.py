"""How a case ends on the pytest side: a failure with its message alone, a warning of the
plugin's own class, the verdict shared with every rank in external mode, and a case left unjudged
because the machine was busy (kept for the results file and the run's last line)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

import pytest

from ..launch import Launcher
from ..verdict.busy import MACHINE_BUSY
from ..verdict.decide import Decision


@dataclass(frozen=True)
class NotJudged:
    """A case that failed without a verdict: ``outcome`` says why (``machine-busy``)."""

    case: str
    outcome: str
    message: str
    label: str  # the launch that stayed beside the interference
    retries: int
    recording: bool
    interference: dict[str, Any]
    # What the case's launches measured, beside the interference (judged by nothing): its unit,
    # windows by launch and median.
    measured: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "outcome": self.outcome, "message": self.message,
                "launch": self.label, "retries": self.retries, "recording": self.recording,
                "interference": self.interference, "measured": self.measured}


# The session's unjudged cases, built in pytest_configure and dropped in pytest_unconfigure.
NOT_JUDGED = pytest.StashKey[list[NotJudged]]()


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


def not_judged(node: pytest.Item, unjudged: NotJudged, launcher: Launcher,
               timeout_s: float) -> NoReturn:
    """Fail the case without a verdict: kept for the results file and the summary, its
    outcome among the test's properties (JUnit XML shows them), every rank told."""
    node.config.stash.setdefault(NOT_JUDGED, []).append(unjudged)
    node.user_properties.append(("dlperf_outcome", unjudged.outcome))
    launcher.share_outcome({"status": "failed", "message": unjudged.message}, timeout_s)
    fail(unjudged.message)


__all__ = ["MACHINE_BUSY", "NOT_JUDGED", "DLPerfWarning", "NotJudged", "conclude", "fail",
           "follow_rank0", "not_judged"]
