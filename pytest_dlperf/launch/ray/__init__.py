"""Ray mode: the ranks of each launch run as Ray actors on a running Ray cluster, one actor per
rank, in a placement group that holds one bundle per node.

pytest connects to the cluster as a Ray driver (``--dlperf-ray-address``, else ``RAY_ADDRESS``:
``host:port`` of its GCS from a node of the cluster, or ``ray://host:10001`` through Ray Client);
it never starts one. Each launch:

1. ``rendezvous``: a placement group (``dlperf-<run id>``) of one bundle per node, each the CPUs
   (and GPUs) of that node's ranks together, ``STRICT_SPREAD`` across nodes (``PACK`` for one
   node), so that ``--nodes N --devices-per-node D`` is N distinct Ray nodes with D ranks each;
   an actor per rank in its node's bundle (CPUs: the case's threads a rank; one GPU a rank on
   CUDA); rank 0's actor picks two free ports on its node's address: rank 0's store
   (``MASTER_ADDR:MASTER_PORT``, torch's env:// rendezvous and the plugin's ``exchange``) and the
   framework's own rendezvous (``DLPERF_FRAMEWORK_PORT``: OneFlow's, Paddle's);
2. ``start``: each actor starts the plugin's rank worker as a process on its node
   (``launch/ray/rank.py``), under the framework's interpreter where ``--dlperf-python`` names
   one, with the variables torchrun's agent would give it;
3. ``collect``: the actors' return values are the ranks' results (through Ray; no shared
   folder); a rank that fails gives the others ``FAILURE_GRACE_S`` to notice, then they are
   stopped; an actor Ray reports dead (its node's raylet gone) fails the launch naming its node;
4. ``stop``: every actor ends its rank's process tree and is killed, the placement group removed.

A pytest that dies without ``stop`` (SIGKILL) is the actors' and the placement group's owner:
Ray ends them with their job (``fate sharing``), and each rank is tied to its actor's process
(``lifeline``). The cluster must see the plugin and the tests' folder at the paths pytest sees
them (the nodes' image, or a shared filesystem), as with Slurm; docs/multinode.md "Ray".
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core import interference
from ...core.installs import EXPECTED_VARIABLE
from ...core.link import format_rate
from ...core.topology import Topology
from ...frameworks import STORE_VARIABLE
from ..base import Launcher, LaunchError
from ..importpath import rank_pythonpath
from ..processes import new_run_id
from ..protocol import LauncherProtocol, Rendezvous
from ..results import collect as read_results
from ..results import result_file
from .nodes import RayNode, alive_nodes, bundles_for, fit_message

ADDRESS_VARIABLE = "RAY_ADDRESS"
NAMESPACE = "pytest-dlperf"
# How long a placement group may take to be placed and its actors to answer.
READY_S = 60.0
# After one rank fails, how long the others get to notice and end by themselves.
FAILURE_GRACE_S = 10.0
# How long the actors get to end their ranks in ``stop`` before they are killed.
STOP_S = 15.0


@dataclass
class RayLaunch:
    """One launch's placement group, actors (by rank), where each runs, and their runs."""

    run_id: str
    group: Any
    actors: list[Any]
    where: list[dict[str, Any]]
    nodes: list[RayNode]
    ports: list[int] = field(default_factory=list)
    runs: list[Any] = field(default_factory=list)
    deadline: float = 0.0
    stopped: bool = False
    previous: Any = None


class RayLauncher(Launcher):
    name = "ray"

    def __init__(self, address: str) -> None:
        import ray

        self.address = address
        began = time.monotonic()
        _check_reachable(address)
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise LookupError(f"--dlperf-launcher=ray: cannot connect to the Ray cluster at "
                              f"{address!r} ({str(exc).splitlines()[0][:300]}); start one "
                              "(ray start --head; scripts/local-ray for one on this machine) "
                              "or pass its address with --dlperf-ray-address") from None
        self.connect_s = time.monotonic() - began
        nodes = alive_nodes()
        here = socket.gethostname()
        # Nodes that are all this machine's (a cluster on one host) share its cores.
        self.all_nodes_here = bool(nodes) and all(n.host == here for n in nodes)
        self._pending: dict[str, RayLaunch] = {}
        self._measured: dict[str, Any] | None = None
        self._remote: Any = None

    # -- the session ---------------------------------------------------------------------

    def why_not_shape(self, nodes: int, devices_per_node: int, device_type: str) -> str | None:
        """Why the cluster cannot hold ``nodes`` x ``devices_per_node`` (None: it can)."""
        return fit_message(alive_nodes(), nodes, devices_per_node, device_type, self.address)

    def network(self, topology: Topology) -> dict[str, Any] | None:
        """The nodes the launch ran on, and what one TCP stream measured from node 0 to node 1
        (once a session, between two of the first launch's actors)."""
        if topology.nodes == 1:
            return None
        facts: dict[str, Any] = {"nodes": "Ray nodes", "link": "the cluster's"}
        if self._measured is not None:
            facts.update(self._measured)
        return facts

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()

    # -- one launch, phase by phase ------------------------------------------------------

    def rendezvous(self, topology: Topology, run_dir: Path) -> Rendezvous:
        """Place the launch (its placement group and actors) and meet at rank 0's node."""
        placed = self._place(topology)
        try:
            placed.ports = self._get(placed.actors[0].ports.remote(2), "rank 0's ports")
            if topology.nodes > 1 and self._measured is None:
                self._measured = self._measure(placed, topology)
        except BaseException:
            self._release(placed)
            raise
        self._pending[placed.run_id] = placed
        return Rendezvous(placed.where[0]["address"], placed.ports[0], placed.run_id)

    def start(self, spec: dict[str, Any], topology: Topology, run_dir: Path,
              meeting: Rendezvous, timeout_s: float) -> RayLaunch:
        launch = self._pending.pop(meeting.run_id)
        if threading.current_thread() is threading.main_thread():
            launch.previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            # rank 0's live progress file would be on its node: the ranks keep none
            sent = {**spec, "progress": None}
            launch.deadline = time.monotonic() + timeout_s
            launch.runs = [actor.run.remote(sent, self._variables(launch, topology, run_dir, rank,
                                                                  spec),
                                            rank, timeout_s)
                           for rank, actor in enumerate(launch.actors)]
        except BaseException:
            self.stop(launch)
            raise
        return launch

    def collect(self, launch: RayLaunch, timeout_s: float) -> list[dict[str, Any]]:
        """The actors' return values; a failure says which rank, on which node, and how."""
        from .collect import gather

        done, outcome, lost = gather(launch.runs, launch.deadline, FAILURE_GRACE_S)
        self.stop(launch)
        try:
            return _checked(done, launch, outcome, timeout_s)
        except LaunchError as error:
            from .collect import with_nodes

            raise with_nodes(error, launch.where, launch.nodes, lost) from None

    def stop(self, launch: RayLaunch) -> None:
        """Every actor ends its rank (bounded), then is killed; the placement group goes."""
        if launch.stopped:
            return
        launch.stopped = True
        try:
            self._release(launch)
        finally:
            if launch.previous is not None:
                signal.signal(signal.SIGTERM, launch.previous)

    # -- the parts -----------------------------------------------------------------------

    def _place(self, topology: Topology) -> RayLaunch:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        nodes = alive_nodes()
        why = fit_message(nodes, topology.nodes, topology.devices_per_node,
                          topology.device_type, self.address, topology.threads_per_worker)
        if why:
            raise LaunchError(why)
        run_id = new_run_id()
        gpu = topology.device_type == "cuda"
        group = placement_group(bundles_for(topology), name=run_id,
                                strategy="STRICT_SPREAD" if topology.nodes > 1 else "PACK")
        launch = RayLaunch(run_id, group, [], [], nodes)
        try:
            ready, _ = ray.wait([group.ready()], timeout=READY_S)
            if not ready:
                raise LaunchError(f"Ray did not place the launch's {topology.nodes} bundle(s) "
                                  f"within {READY_S:g} s ({_bundle_text(topology)}); "
                                  + (fit_message(alive_nodes(), topology.nodes,
                                                 topology.devices_per_node,
                                                 topology.device_type, self.address,
                                                 topology.threads_per_worker)
                                     or "another job may hold the nodes' resources"))
            host = self._actor_class()
            for rank in range(topology.world_size):
                strategy = PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=rank // topology.devices_per_node)
                launch.actors.append(host.options(
                    name=f"{run_id}-r{rank}", num_cpus=topology.threads_per_worker,
                    num_gpus=1 if gpu else 0, max_concurrency=4,
                    scheduling_strategy=strategy).remote())
            launch.where = self._get([a.where.remote() for a in launch.actors], "the actors")
            if self.all_nodes_here:  # the actors and their ranks are this host's work
                interference.adopt([w["pid"] for w in launch.where])
        except BaseException:
            self._release(launch)
            raise
        return launch

    def _actor_class(self) -> Any:
        import ray

        from .rank import RankHost

        if self._remote is None:
            self._remote = ray.remote(RankHost)
        return self._remote

    def _get(self, refs: Any, what: str, timeout_s: float = READY_S) -> Any:
        import ray

        try:
            return ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise LaunchError(f"{what} did not answer within {timeout_s:g} s on the Ray "
                              "cluster") from None
        except ray.exceptions.RayError as exc:
            raise LaunchError(f"{what} failed on the Ray cluster: "
                              f"{str(exc).splitlines()[0][:400]}") from None

    def _variables(self, launch: RayLaunch, topology: Topology, run_dir: Path,
                   rank: int, spec: dict[str, Any] | None = None) -> dict[str, str]:
        """What rank ``rank``'s process gets, as torchrun's agent would give it, with rank 0's
        node as the meeting point (``spec``: its launch-only ``import_paths`` and
        ``expected_imports``, an A/B side's own code)."""
        spec = spec or {}
        per_node = topology.devices_per_node
        node, local = divmod(rank, per_node)
        where = launch.where[rank]
        threads = str(topology.threads_per_worker)
        variables = {
            "RANK": str(rank), "LOCAL_RANK": str(local), "ROLE_RANK": str(rank),
            "GROUP_RANK": str(node), "WORLD_SIZE": str(topology.world_size),
            "LOCAL_WORLD_SIZE": str(per_node), "ROLE_WORLD_SIZE": str(topology.world_size),
            "MASTER_ADDR": launch.where[0]["address"], "MASTER_PORT": str(launch.ports[0]),
            "DLPERF_FRAMEWORK_PORT": str(launch.ports[1]), STORE_VARIABLE: "rank0",
            "DLPERF_WORKER_HOST": where["address"],
            "DLPERF_NODES_SHARE_HOST": "1" if len({w["address"] for w in launch.where})
            < topology.nodes else "0",
            "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1",
            EXPECTED_VARIABLE: ",".join(spec.get("expected_imports") or []),
            "PYTHONPATH": rank_pythonpath(run_dir, spec.get("import_paths"),
                                          os.environ.get("PYTHONPATH")),
        }
        if where.get("interface"):  # gloo and NCCL bind the node's Ray address's interface
            variables["GLOO_SOCKET_IFNAME"] = variables["NCCL_SOCKET_IFNAME"] = \
                where["interface"]
        if topology.device_type == "cuda":  # the node's ranks' GPUs, in local-rank order
            gpus = [g for w in launch.where[node * per_node:(node + 1) * per_node]
                    for g in w["gpus"]]
            variables["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        return {**forwarded(os.environ), **variables}

    def _measure(self, launch: RayLaunch, topology: Topology) -> dict[str, Any]:
        """One TCP stream from node 0's first actor to node 1's, for half a second."""
        try:
            receiver = launch.actors[topology.devices_per_node]
            port = self._get(receiver.listen.remote(), "the link probe's receiver")
            self._get(launch.actors[0].send.remote(launch.where[topology.devices_per_node]
                                                   ["address"], port, 0.5), "the link probe")
            rate = float(self._get(receiver.received.remote(), "the link probe's receiver"))
        except LaunchError as error:
            return {"addresses": [], "measured": None, "measure_error": error.summary[:300]}
        addresses = [launch.where[n * topology.devices_per_node]["address"]
                     for n in range(topology.nodes)]
        return {"addresses": addresses, "measured_bps": rate, "measured": format_rate(rate)}

    def _release(self, launch: RayLaunch) -> None:
        from .collect import release

        try:
            release(launch.actors, launch.group, STOP_S)
        finally:
            interference.disown([w["pid"] for w in launch.where])


def _checked(done: dict[int, dict[str, Any]], launch: RayLaunch, outcome: str,
             timeout_s: float) -> list[dict[str, Any]]:
    """The ranks' results through the default channel's checks (``results.collect``: the same
    messages for a failed, out-of-memory, killed or stuck rank), from what the actors
    returned, written to a folder of this host first."""
    import json
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=f"{launch.run_id}-"))
    try:
        exits: dict[int, int] = {}
        for rank, answer in done.items():
            result = answer.get("result")
            if answer.get("oom") and result is None:
                result = {"error": answer["oom"], "error_type": "out_of_memory"}
            if result is not None:
                result_file(folder, rank).write_text(json.dumps(result))
            elif isinstance(answer.get("exit"), int) and answer["exit"] != 0:
                exits[rank] = answer["exit"]
        tail = "".join(f"--- rank {rank} (on {launch.where[rank]['address']}) ---\n"
                       f"{answer.get('log_tail', '')[-3000:]}\n"
                       for rank, answer in sorted(done.items()) if answer.get("log_tail"))
        return read_results(folder, len(launch.actors), outcome, timeout_s, tail, exits)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# pytest's variables that describe its own host, not a rank's: they stay behind (the rank
# gets its node's), as do those the launcher sets per rank.
_HOST_BOUND = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "HOSTNAME", "DISPLAY",
               "MAIL", "SHLVL", "_", "TMPDIR", "TEMP", "TMP", "LD_LIBRARY_PATH", "LD_PRELOAD",
               "PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES",
               "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHON_EXEC",
               "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
_HOST_BOUND_PREFIXES = ("RAY_", "SLURM_", "SSH_", "XDG_", "TERM", "CONDA_", "PYTEST_", "LC_",
                        "TORCHELASTIC_", "DLPERF_LIFELINE")


def forwarded(environ: Any) -> dict[str, str]:
    """What of pytest's environment travels with each rank, as ``srun --export=ALL`` carries
    it (a user's NCCL_*, their recipes' own variables), less what is bound to pytest's host."""
    return {k: v for k, v in environ.items()
            if k not in _HOST_BOUND and not k.startswith(_HOST_BOUND_PREFIXES)}


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """``LookupError`` where nothing answers at the address's port (ray.init would retry for
    minutes); ``auto`` (a node's own cluster) is left to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise LookupError(f"--dlperf-launcher=ray: cannot connect to the Ray cluster at "
                          f"{address!r} ({exc.strerror or exc}); start one (ray start --head; "
                          "scripts/local-ray for one on this machine) or pass its address with "
                          "--dlperf-ray-address") from None


def _bundle_text(topology: Topology) -> str:
    bundle = bundles_for(topology)[0]
    return ", ".join(f"{v:g} {k}" for k, v in bundle.items()) + " each"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def make(environ: dict[str, str]) -> RayLauncher:
    """``--dlperf-launcher ray``: connected to the cluster at ``RAY_ADDRESS`` (the plugin puts
    ``--dlperf-ray-address`` there)."""
    address = environ.get(ADDRESS_VARIABLE, "").strip()
    if not address:
        raise LookupError("--dlperf-launcher=ray needs a running Ray cluster's address: "
                          "--dlperf-ray-address HOST:PORT (its GCS, from a node of the "
                          "cluster) or ray://HOST:10001 (Ray Client), or RAY_ADDRESS; "
                          "scripts/local-ray starts one on this machine")
    try:
        import ray  # noqa: F401
    except ImportError:
        raise LookupError("--dlperf-launcher=ray: Ray is not installed in pytest's "
                          "environment (pip install 'pytest-dlperf[ray]')") from None
    return RayLauncher(address)


# mypy checks the launcher against the protocol here.
_PROTOCOL: type[LauncherProtocol[RayLaunch]] = RayLauncher
