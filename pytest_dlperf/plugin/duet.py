"""Duet A/B (``--dlperf-ab-mode duet``): base and head launched at the same time on disjoint
halves of this host, so that both see the same interference (Bulej et al., "Duet
Benchmarking", ICPE 2020). On CPU the host's cores are split in two, each side's ranks pinned to
its half (``rank.worker.place``); on GPUs the devices are split too (CUDA_VISIBLE_DEVICES per
side). Every rank of both sides meets the others on a barrier before each timed window
(``rank.barrier``), so window k of each side covers the same wall time; which side gets which
half swaps from one launch to the next, so a half's own speed cancels over the launches.
A case that needs more than half the machine is refused by name: turns is the mode for it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..core.protocol import Result
from ..core.spec import RankSpec
from ..launch import Cluster
from ..rank.barrier import Barrier
from .launches import Launches
from .outcome import fail

HALVES = ("A", "B")


@dataclass(frozen=True)
class Halves:
    """The two halves of the host: cores (and GPUs, as CUDA_VISIBLE_DEVICES entries)."""

    cpus: tuple[list[int], list[int]]
    devices: tuple[list[str], list[str]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: {"cpus": self.cpus[i],
                       **({"devices": self.devices[i]} if self.devices is not None else {})}
                for i, name in enumerate(HALVES)}


def split(cpus: list[int], devices: list[str] | None = None) -> Halves:
    """Halves of equal size (an odd core or device is left out: the two sides alike)."""
    def halve(items: list[Any]) -> tuple[list[Any], list[Any]]:
        half = len(items) // 2
        return list(items[:half]), list(items[half:2 * half])

    return Halves(halve(sorted(cpus)), halve(devices) if devices is not None else None)


def host_halves(device_type: str, gpus: int, environ: dict[str, str] | None = None) -> Halves:
    """This host's halves: the cores this process may run on, and on CUDA the devices it sees
    (CUDA_VISIBLE_DEVICES's entries where set, else ``gpus`` of them)."""
    devices = None
    if device_type == "cuda":
        visible = (environ if environ is not None else dict(os.environ)).get(
            "CUDA_VISIBLE_DEVICES")
        devices = ([d.strip() for d in visible.split(",") if d.strip()] if visible is not None
                   else [str(i) for i in range(gpus)])
    return split(sorted(os.sched_getaffinity(0)), devices)


def refusal(cluster: Cluster, halves: Halves) -> str | None:
    """Why this case cannot run in duet here, or None."""
    topology = cluster.topology
    ranks = topology.world_size
    why = None
    if cluster.launcher.name != "local":
        why = (f"the {cluster.launcher.name} launcher's ranks are not this host's to split "
               "(duet runs on the local launcher)")
    elif topology.nodes > 1:
        why = (f"it is a {topology.nodes}-node case: duet splits one host, and each side "
               "would need every node")
    elif halves.devices is not None and ranks > len(halves.devices[0]):
        why = (f"it needs {ranks} GPU(s) a side and half of this host's "
               f"{2 * len(halves.devices[0])} is {len(halves.devices[0])}")
    elif ranks > len(halves.cpus[0]):
        why = (f"it runs {ranks} rank(s) a side and half of this host's "
               f"{2 * len(halves.cpus[0])} cores is {len(halves.cpus[0])}")
    if why is None:
        return None
    return (f"--dlperf-ab-mode duet runs base and head at once on halves of this host, and "
            f"{topology.id} does not fit in half: {why}; run it with --dlperf-ab-mode turns")


def placed(spec: RankSpec, halves: Halves, half: int, ranks: int, barrier: Path,
           timeout_s: float) -> RankSpec:
    """``spec`` on half ``half`` (0: A, 1: B): its cores, threads and devices, and the barrier
    the ``2 * ranks`` ranks of both sides meet at."""
    cpus = halves.cpus[half]
    return replace(spec, cpus=list(cpus), threads=max(1, len(cpus) // ranks),
                   visible_devices=(list(halves.devices[half]) if halves.devices is not None
                                    else None),
                   barrier=str(barrier), barrier_parties=2 * ranks,
                   barrier_timeout_s=timeout_s)


def base_half(launch: int) -> int:
    """The half the base side runs on in duet launch ``launch`` (0-based): A, B, A, ..."""
    return launch % 2


class _Quiet(Launches):
    """The base side's launches: no live progress line (the head's shows the duet's)."""

    def watch(self, label: str, windows: bool = True) -> Any:
        return None


# Each side's cluster and the spec its ranks get (``ab.Sides``).
Sides = dict[str, tuple[Cluster, RankSpec]]
Launched = tuple[Result, dict[str, Any]]  # a side's figures and its ranks' environment


def launch(launches: Launches, sides: Sides, halves: Halves, index: int, windows: int,
           who: Callable[[str], str]) -> tuple[Launched, Launched]:
    """Duet launch ``index``: both sides at once on their halves, ``windows`` windows each;
    (base, head) figures, each with what its ranks reported of their environment. A side that fails fails the case naming that side (not the other,
    whose ranks then stop at the barrier)."""
    head_cluster = sides["head"][0]
    ranks = head_cluster.world_size
    folder = Path(tempfile.mkdtemp(prefix="duet-", dir=_root(head_cluster)))
    timeout_s = 0.8 * head_cluster.timeout_s  # before the launch's own timeout: the clearer
    label = f"duet {index + 1}"
    quiet = _Quiet(launches.case)
    try:
        with ThreadPoolExecutor(2, thread_name_prefix="dlperf-duet") as pool:
            futures = {}
            for side in ("base", "head"):
                cluster, spec = sides[side]
                half = base_half(index) if side == "base" else 1 - base_half(index)
                spec = placed(replace(spec, protocol=replace(spec.protocol, repeats=windows)),
                              halves, half, ranks, folder, timeout_s)
                runner = launches if side == "head" else quiet
                futures[side] = pool.submit(_run, runner, cluster, spec, folder,
                                            label=f"{side}, {label} (half {HALVES[half]})",
                                            who=who(side))
            errors = {side: f.exception() for side, f in futures.items()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    failed = [e for e in errors.values() if e is not None]
    if failed:  # the side that failed first, not the one it left waiting at the barrier
        first = next((e for e in failed if "duet barrier" not in str(e)), failed[0])
        raise first
    return futures["base"].result(), futures["head"].result()


def _run(launches: Launches, cluster: Cluster, spec: RankSpec, folder: Path, *, label: str,
         who: str) -> Launched:
    """One side's launch; where it fails, its ranks may have died without a word (killed for
    memory, say): the barrier hears of it from here, so the other side stops waiting."""
    try:
        return launches.run(cluster, spec, label=label, who=who)
    except BaseException as exc:
        Barrier(folder, 0, 0.0, f"side-{label.split(',')[0]}").break_(
            f"the {label.split(',')[0]} side's launch ended: {str(exc).splitlines()[0][:300]}")
        raise


def _root(cluster: Cluster) -> Path:
    cluster.work_root.mkdir(parents=True, exist_ok=True)
    return cluster.work_root


def check(case_id: str, cluster: Cluster, halves: Halves) -> None:
    """Fail the case now, by name, where it cannot run in duet."""
    why = refusal(cluster, halves)
    if why is not None:
        fail(f"pytest-dlperf: {case_id}: {why}")
