"""The regression verdict: a measured throughput against its baseline, higher is better."""

from __future__ import annotations

from dataclasses import asdict, dataclass

PASS = "pass"
REGRESSION = "regression"
IMPROVEMENT = "improvement"
NO_BASELINE = "no-baseline"


@dataclass(frozen=True)
class Verdict:
    outcome: str
    measured: float
    baseline: float | None = None
    tolerance: float | None = None

    @property
    def threshold(self) -> float | None:
        """The lowest throughput that still passes."""
        if self.baseline is None or self.tolerance is None:
            return None
        return self.baseline * (1 - self.tolerance)

    @property
    def delta(self) -> float | None:
        """Relative change against the baseline (+0.03 is 3% faster)."""
        if self.baseline is None:
            return None
        return self.measured / self.baseline - 1

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data.update(threshold=self.threshold, delta=self.delta)
        return data


def compare(measured: float, baseline: float | None, tolerance: float) -> Verdict:
    """Median against median: slower beyond ``tolerance`` regresses, faster beyond it improves."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    if baseline is None:
        return Verdict(NO_BASELINE, measured)
    if measured < baseline * (1 - tolerance):
        outcome = REGRESSION
    elif measured > baseline * (1 + tolerance):
        outcome = IMPROVEMENT
    else:
        outcome = PASS
    return Verdict(outcome, measured, baseline, tolerance)
