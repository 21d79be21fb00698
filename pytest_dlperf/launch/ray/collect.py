"""How the Ray launcher (``launch/ray/__init__.py``) waits for its actors' results, says which node a
failed rank ran on, and takes a launch's actors and placement group down."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any

from ..base import LaunchError
from .nodes import RayNode


def gather(runs: list[Any], deadline: float, grace_s: float
           ) -> tuple[dict[int, dict[str, Any]], str, dict[int, str]]:
    """Wait for the ranks' ``run`` calls (by rank): what each returned, the outcome (``ok``,
    ``failed``: a rank failed, or its actor died, and the others had ``grace_s`` to end;
    ``timeout``), and the ranks whose actor Ray reported dead, with Ray's reason."""
    import ray

    pending = {ref: rank for rank, ref in enumerate(runs)}
    done: dict[int, dict[str, Any]] = {}
    lost: dict[int, str] = {}
    failed_at: float | None = None
    while pending:
        now = time.monotonic()
        if now > deadline:
            return done, "timeout", lost
        if failed_at is not None and now - failed_at > grace_s:
            return done, "failed", lost
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
        for ref in ready:
            rank = pending.pop(ref)
            try:
                answer = ray.get(ref)
            except ray.exceptions.RayError as exc:
                lost[rank] = _reason(exc)
                failed_at = failed_at or time.monotonic()
                continue
            done[rank] = answer
            result = answer.get("result")
            if result is None or "error" in result:
                failed_at = failed_at or time.monotonic()
    return done, "failed" if failed_at is not None else "ok", lost


def _reason(exc: Exception) -> str:
    """Ray's reason an actor is gone, on one line."""
    text = " ".join(str(exc).split())
    found = re.search(r"(The actor died[^.]*\.|The actor is dead[^.]*\.|"
                      r"[^.]*node[^.]*(?:died|dead|failed)[^.]*\.)", text)
    return (found.group(1) if found else text)[:400].strip()


def with_nodes(error: LaunchError, where: list[dict[str, Any]], nodes: list[RayNode],
               lost: dict[int, str]) -> LaunchError:
    """``error`` with each rank's node named (its first mention) and the ranks whose actor
    Ray reported dead, with the node it was on."""
    names = {n.node_id: n.name for n in nodes}

    def node(rank: int) -> str:
        info = where[rank]
        name = names.get(info.get("node_id", ""), info["address"])
        return name if name == info["address"] else f"{name}, {info['address']}"

    summary = error.summary
    for rank in range(len(where)):
        summary = re.sub(rf"\brank {rank}\b(?! \(on)", f"rank {rank} (on {node(rank)})",
                         summary, count=1)
    if lost:
        summary += " [Ray: " + "; ".join(
            f"the actor of rank {rank} on {node(rank)} is gone: {reason}"
            for rank, reason in sorted(lost.items())) + "]"
    return replace(error, summary=summary)


def release(actors: list[Any], group: Any, stop_s: float) -> None:
    """Each actor ends its rank's processes (within ``stop_s`` in all), then is killed; the
    placement group is removed."""
    import ray
    from ray.util.placement_group import remove_placement_group

    try:
        stops = [actor.stop.remote() for actor in actors]
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=stop_s)
    finally:
        for actor in actors:
            try:
                ray.kill(actor)
            except ray.exceptions.RayError:
                pass
        if group is not None:
            remove_placement_group(group)
