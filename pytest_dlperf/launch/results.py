"""The default result channel, and what a rank's result or its absence means.

A rank started as ``python -m pytest_dlperf.rank.worker SPEC OUT_DIR`` hands its result to a file
in the run's folder (``OUT_DIR/rank-<RANK>.json``, written atomically, last thing before it
exits); the launchers that start processes (local, slurm) read those files here once the
processes are reaped (``collect``). A launcher whose ranks share no folder with pytest carries
each rank's result its own way (the worker's ``rank_result`` returns it as plain JSON) and
checks what arrived with ``checked``: either way a rank that failed, ran out of memory or never
answered becomes one ``LaunchError`` that says so.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import LaunchError


def oom_killed(out_dir: Path, world_size: int) -> dict[int, str]:
    """Ranks under --dlperf-memory-limit whose memory cgroup's OOM killer ended them (they
    die by SIGKILL, writing nothing); each rank's cgroup is removed here, its processes gone."""
    from ..core.cgroup import limit_file, oom_kills, release

    killed = {}
    for rank in range(world_size):
        path = Path(limit_file(str(out_dir), rank))
        if not path.exists():
            continue
        try:
            applied = json.loads(path.read_text())
        except ValueError:
            continue
        if oom_kills(applied):
            killed[rank] = (
                f"rank {rank} ran out of memory at batch {applied.get('batch_size')} (per "
                "device): the kernel's OOM killer ended it in its memory "
                f"cgroup ({applied['mechanism']}, limit {applied['limit_bytes'] / 2 ** 20:,.0f} "
                "MiB, --dlperf-memory-limit)")
        release(applied)
    return killed


def result_file(out_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its result (``pytest_dlperf.rank.worker.result_path``)."""
    return out_dir / f"rank-{rank}.json"


def read_files(out_dir: Path, world_size: int) -> dict[int, dict[str, Any]]:
    """What the ranks handed to the default channel: each rank's file that exists, by rank."""
    found = {}
    for rank in range(world_size):
        path = result_file(out_dir, rank)
        if path.exists():
            found[rank] = json.loads(path.read_text())
    return found


def _sort(found: Mapping[int, Mapping[str, Any]], world_size: int
          ) -> tuple[dict[int, dict[str, Any]], dict[int, str], set[str]]:
    """The results, the errors by rank and the errors' types, of what the ranks handed back."""
    results: dict[int, dict[str, Any]] = {}
    errors: dict[int, str] = {}
    kinds: set[str] = set()
    for rank in range(world_size):
        data = found.get(rank)
        if data is None:
            continue
        if "error" in data:
            errors[rank] = str(data["error"])
            kinds.add(str(data.get("error_type", "")))
        else:
            results[rank] = dict(data)
    return results, errors, kinds


def _failure(errors: dict[int, str], kinds: set[str], world_size: int) -> tuple[str, str]:
    """The kind and summary of a launch in which ``errors``' ranks failed."""
    kind = ("diverged" if "diverged" in kinds else
            "out_of_memory" if "out_of_memory" in kinds else "failed")
    summary = (f"{len(errors)} of {world_size} ranks ran out of memory"
               if kind == "out_of_memory" else
               f"{len(errors)} of {world_size} ranks failed ({kind})")
    return kind, summary


def checked(found: Mapping[int, Mapping[str, Any]], world_size: int, timeout_s: float,
            timed_out: bool = False) -> list[dict[str, Any]]:
    """Every rank's result in rank order, from results a launcher carried its own way (by
    rank: what ``rank.worker.rank_result`` returned there); else a ``LaunchError``: the ranks
    that failed (with their errors), or those that never answered (``timed_out``: because the
    launcher stopped waiting for them)."""
    results, errors, kinds = _sort(found, world_size)
    missing = [r for r in range(world_size) if r not in results and r not in errors]
    if not errors and not missing:
        return [results[r] for r in range(world_size)]
    if errors:
        kind, summary = _failure(errors, kinds, world_size)
    elif timed_out:
        kind, summary = "timeout", f"timed out after {timeout_s:g} s; stuck ranks: {missing}"
    else:
        kind, summary = "failed", f"ranks {missing} ended without handing back a result"
    raise LaunchError(summary, errors, missing, "", kind)


def collect(out_dir: Path, world_size: int, outcome: str, timeout_s: float,
            log_tail: str, exits: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """Every rank's result from the default channel (the run folder's files), in rank order;
    else a ``LaunchError`` saying what went wrong. ``exits``: exit statuses of ranks that no
    agent started (an agent's log says the others')."""
    exits = exits or {}
    results, errors, kinds = _sort(read_files(out_dir, world_size), world_size)
    for rank, message in oom_killed(out_dir, world_size).items():
        if rank not in results and rank not in errors:
            errors[rank] = message
            kinds.add("out_of_memory")
    missing = [r for r in range(world_size) if r not in results and r not in errors]
    if not errors and not missing and outcome == "ok":
        return [results[r] for r in range(world_size)]
    if errors:
        kind, summary = _failure(errors, kinds, world_size)
        # A rank that died without a word (a crash in a framework's own code) is often why
        # the others failed (a peer's connection closed): say how it ended first.
        if missing and _exit_codes(missing, log_tail, exits):
            ended = _ended_without_result(missing, log_tail, exits, log_shown=False)
            summary = f"{ended}; {summary}"
    elif outcome == "timeout":
        kind, summary = "timeout", f"timed out after {timeout_s:g} s; stuck ranks: {missing}"
    else:
        kind, summary = "failed", _ended_without_result(missing, log_tail, exits)
    raise LaunchError(summary, errors, missing, log_tail, kind)


# torchrun's failure summary, one block per failed rank: "rank : 1 (local_rank: 1)" then
# "exitcode : -9 (pid: 123)".
_RANK_EXIT = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)",
                        re.DOTALL)


def _exit_codes(missing: list[int], log_tail: str, exits: dict[int, int]) -> dict[int, int]:
    """The exit statuses of ``missing`` ranks: torchrun's log's, or ``exits`` (ranks started
    without an agent)."""
    codes = {int(rank): int(code) for rank, code in _RANK_EXIT.findall(log_tail)
             if int(rank) in missing}
    codes.update((rank, code) for rank, code in exits.items() if rank in missing)
    return codes


def _ended_without_result(missing: list[int], log_tail: str, exits: dict[int, int],
                          log_shown: bool = True) -> str:
    """Which ranks ended without writing a result, and how, as torchrun's log (or ``exits``,
    for ranks started without an agent) says."""
    codes = _exit_codes(missing, log_tail, exits)
    if not codes:
        return f"the launcher failed before ranks {missing} reported"
    parts = []
    for rank, code in sorted(codes.items()):
        how = (f"killed by {signal.Signals(-code).name}" if code < 0
               and -code in signal.valid_signals() else f"exit code {code}")
        parts.append(f"rank {rank} ended ({how}) without a result")
    rest = [r for r in missing if r not in codes]
    tail = f"; ranks {rest} did not report either" if rest else ""
    return "; ".join(parts) + tail + (" (the rank's own output is in the log below)"
                                       if log_shown else "")
