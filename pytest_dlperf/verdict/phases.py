"""Which phases of the step moved between the baseline and this run: what a regression's
message says after the throughput (pure, no I/O)."""

from __future__ import annotations

from ..core.phases import MOVED_OF_CHANGE, MOVED_OF_PHASE, MOVED_OF_STEP, Phases


def moved(before: Phases, after: Phases) -> list[str]:
    """The phases both runs have whose seconds per step changed by at least ``MOVED_OF_PHASE``
    of the phase, ``MOVED_OF_STEP`` of the baseline's step and ``MOVED_OF_CHANGE`` of the
    change of the phases' sum, in step order."""
    names = [name for name in after.order if name in before.seconds]
    step = sum(before.seconds[name] for name in names)
    change = abs(sum(after.seconds[name] for name in names) - step)
    return [name for name in names
            if abs(after.seconds[name] - before.seconds[name])
            >= max(MOVED_OF_PHASE * before.seconds[name], MOVED_OF_STEP * step,
                   MOVED_OF_CHANGE * change)]


def where(before: Phases, after: Phases) -> str | None:
    """``backward 0.231 -> 0.259 s/step (+12%); forward, optimizer, exposed communication
    unchanged``; None where the two runs share no phase (one ran none, or cut its step
    otherwise)."""
    names = [name for name in after.order if name in before.seconds]
    if not names:
        return None
    changed = moved(before, after)
    parts = []
    for name in changed:
        old, new = before.seconds[name], after.seconds[name]
        change = f" ({new / old - 1:+.0%})" if old > 0 else ""
        parts.append(f"{name} {_s(old)} -> {_s(new)} s/step{change}")
    same = [name for name in names if name not in changed]
    if same:
        parts.append(f"{', '.join(same)} unchanged")
    if not changed:
        parts[-1] = (f"no phase moved by {MOVED_OF_PHASE:.0%} of itself and "
                     f"{MOVED_OF_STEP:.0%} of the step ({', '.join(same)})")
    return "; ".join(parts)


def _s(seconds: float) -> str:
    return f"{seconds:.3g}" if seconds >= 0.001 else f"{seconds:.2g}"


def suffix(before: Phases | None, after: Phases | None) -> str:
    """A regression message's tail: where the step's time went, against the baseline's."""
    if before is None or after is None:
        return ""
    text = where(before, after)
    return (f". Where the step's time went (diagnostic steps after the windows, baseline -> "
            f"now): {text}" if text else "")
