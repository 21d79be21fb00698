"""A private network namespace for local mode, so nothing a case binds is reachable from outside.

torch's TCPStore (the c10d rendezvous store and the agent's store) listens on every interface
whatever address it is given (so does the store rank 0 hosts when one node's ranks start without
agents). On Linux with unprivileged user namespaces, local mode therefore starts its agents (or
one node's ranks) inside ``unshare --user --map-root-user --net``: a namespace whose only
interface is loopback. Where that is not allowed (some containers, other OSes) it runs them as
they are and says so in the results (``rendezvous_isolation``).

``python -m pytest_dlperf.launch.local.netns PLAN.json`` is the process inside the namespace: it brings
loopback up, starts every command of the plan (agents, or ranks) with its own log, and waits like
the launcher does.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ...core.lifeline import die_with_parent, tethered
from ...core.link import Link
from ..onehost import userhosts
from ..processes import EXITS_FILE, kill_tree, wait_all


@functools.lru_cache(maxsize=1)
def available() -> bool:
    if not sys.platform.startswith("linux") or not (shutil.which("unshare") and shutil.which("ip")):
        return False
    try:
        probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "ip", "link",
                                "set", "lo", "up"], capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def wrap(commands: list[list[str]], logs: list[Path], plan_path: Path,
         hosts: str | None = None) -> list[str]:
    """One command that runs all ``commands`` (logging to ``logs``) inside a new namespace;
    ``hosts`` (a link, ``core.link``): each command in a node of its own there
    (``userhosts``)."""
    plan_path.write_text(json.dumps({"commands": commands, "logs": [str(p) for p in logs],
                                     "parent": os.getpid(), "hosts": hosts}))
    return ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-m",
            "pytest_dlperf.launch.local.netns", str(plan_path)]


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[0]).read_text())
    # pytest started this process (through unshare, which may clear the parent-death signal
    # as it changes user namespace): end with pytest, whatever ends it.
    die_with_parent(parent=plan["parent"])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    commands = plan["commands"]
    nodes: list[userhosts.Node] = []
    procs: list[subprocess.Popen[bytes]] = []
    ended: list[int | None] = []
    try:
        if plan.get("hosts") is not None:
            nodes = userhosts.build(len(commands), Link.parse(plan["hosts"]))
            commands = [node.command(command) for node, command in zip(nodes, commands)]
        for command, log in zip(commands, plan["logs"]):
            with open(log, "wb") as fh:
                procs.append(subprocess.Popen(tethered(command), stdout=fh,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
        outcome = wait_all(procs, deadline=float("inf"))
        ended = [p.poll() for p in procs]
    finally:
        kill_tree(procs)
        userhosts.release(nodes)
        # How each command ended on its own (None: reaped here after another failed), for a
        # launcher whose commands are the ranks themselves (no agent to say how they ended).
        Path(argv[0]).with_name(EXITS_FILE).write_text(json.dumps(ended))
    return 0 if outcome == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
