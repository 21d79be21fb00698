"""``dlperf ray``: a local Ray cluster (``cluster``) kept by ``keeper``, which starts, holds and
stops it; here what the keeper needs of Ray's kind (``KIND``). Commands run on the head's host,
where a Ray driver (pytest with ``--dlperf-launcher ray``) connects to the cluster."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from ..onehost.keeper import Kind
from .cluster import HEAD, RECORD, LocalRay, LocalRayError, stop_recorded

DEFAULT_STATE = Path("/tmp/dlperf-ray")


def _attach(state: Path, record: dict[str, Any]) -> LocalRay:
    return LocalRay(state, nodes=int(record["nodes"]), cpus=int(record["cpus"])).attached(record)


def usage(cluster: LocalRay) -> str:
    state = "" if cluster.state_dir == DEFAULT_STATE else f" --state {cluster.state_dir}"
    hosts = ", ".join(f"{name} {host.address}" for name, host in cluster.hosts.items())
    return "\n".join([
        f"A Ray cluster of {cluster.nodes} worker node(s) of {cluster.cpus} CPU(s) and its head "
        f"on this machine, each its own network host ({hosts}); its GCS at {cluster.address}; "
        f"state in {cluster.state_dir}.",
        "Drivers run on the head's host, e.g.:",
        f"  dlperf ray run{state} -- ray status",
        f"  dlperf ray run{state} -- pytest perf_tests -m multinode --nodes {cluster.nodes} "
        "--dlperf-launcher ray",
        f"  (or yourself: RAY_ADDRESS={cluster.address} "
        f"{shlex.join(cluster.on(HEAD, ['CMD']))})",
        f"Stop it: dlperf ray stop{state}",
    ])


def _client(cluster: LocalRay, command: list[str]) -> tuple[list[str], dict[str, str]]:
    # ray and pytest beside this interpreter, as scripts/local-ray runs it
    env = cluster.environment()
    env["PATH"] = str(Path(sys.executable).parent) + ":" + env.get("PATH", "")
    return cluster.on(HEAD, command), env


def _status(cluster: LocalRay) -> list[str]:
    return [f"nodes: {', '.join(cluster.node_names)} (ranks), {HEAD} (GCS at "
            f"{cluster.address}, no CPUs)"]


KIND = Kind("ray", "local Ray cluster", RECORD,
            make=lambda nodes, state: LocalRay(state, nodes=nodes), attach=_attach,
            error=LocalRayError, usage=usage, stop_recorded=stop_recorded, status=_status,
            client=_client)
