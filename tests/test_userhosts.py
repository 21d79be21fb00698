"""Local nodes as network hosts for a user who is not root (``launch.userhosts``): the nodes are
built inside each launch's own user namespace, and a case's gradients cross their shaped link.

Run as root, the session is run as ``nobody`` (``setpriv``), with no capability left: the same
position as any user's. Its interpreter must be one ``nobody`` can run, so it gets a venv of the
system's Python of this minor version that reads this one's packages; where there is none, the
test skips saying so. Run as another user, the session runs as that user."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pytest_dlperf.launch.onehost import fabric

pytestmark = pytest.mark.alone("it bounds a case's throughput by its shaped link")

NOBODY = 65534
SYSTEM_PYTHON = Path(f"/usr/bin/python3.{sys.version_info.minor}")


def _session_prefix(folder: Path) -> tuple[list[str], str]:
    """How to start a command as a user who is not root, and the interpreter that user runs."""
    if os.geteuid() != 0:
        return [], sys.executable
    if not (shutil.which("setpriv") and SYSTEM_PYTHON.exists()):
        pytest.skip(f"running as nobody needs setpriv and {SYSTEM_PYTHON}")
    venv = folder / "venv"
    subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    ours = [p for p in map(Path, sys.path) if p.name == "site-packages" and p.is_dir()]
    (site / "ours.pth").write_text("".join(f"import site; site.addsitedir({str(p)!r})\n"
                                           for p in ours))
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    return (["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "--inh-caps=-all", "--bounding-set=-all", "--"], str(venv / "bin" / "python"))


@pytest.fixture
def unprivileged() -> Iterator[tuple[Path, list[str]]]:
    """A folder that user owns and the command prefix that runs its session."""
    folder = Path(tempfile.mkdtemp(prefix="dlperf-unprivileged-"))
    folder.chmod(0o755)
    try:
        prefix, python = _session_prefix(folder)
        env = {"HOME": str(folder), "PATH": f"{Path(python).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
               "LANG": "C.UTF-8"}
        probe = subprocess.run(
            ["env", "-i", *[f"{k}={v}" for k, v in env.items()], *prefix, python, "-c",
             "import torch, pytest_dlperf.launch.onehost.userhosts as u; print(u.available())"],
            capture_output=True, text=True, cwd=folder)
        if probe.returncode != 0 or not probe.stdout.startswith("(True"):
            pytest.skip(f"no nodes as hosts for a user here: {probe.stdout}{probe.stderr[-300:]}")
        yield folder, ["env", "-i", *[f"{k}={v}" for k, v in env.items()], *prefix, python]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_user_who_is_not_root_gets_nodes_as_hosts_and_their_shaped_link(
        unprivileged: tuple[Path, list[str]]) -> None:
    from test_fabric import ACROSS, WIDE, WIDE_TEST

    folder, python = unprivileged
    (folder / "wide.py").write_text(WIDE)
    (folder / "test_wide.py").write_text(WIDE_TEST)
    before = fabric.leftovers()
    done = subprocess.run([*python, "-m", "pytest", *ACROSS, "--dlperf-launches", "1",
                           "--dlperf-link", "100mbit", "--dlperf-json", "r.json",
                           "--dlperf-speedup", "off"],  # (the link is what is checked)
                          capture_output=True, text=True, cwd=folder, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    case = json.loads((folder / "r.json").read_text())["benchmarks"][0]["extra_info"]
    network = case["network"]
    assert "inside a user namespace" in network["nodes"], network
    assert len(set(network["addresses"])) == 2 and network["link"] == "100mbit", network
    assert case["fingerprint"]["link"] == "100mbit"
    assert 70e6 < network["measured_bps"] < 105e6, network  # a pair built as the case's was

    # The case's own gradients crossed that link: one step all-reduces the model's 4 MiB, each
    # rank sending and receiving about all of it (two ranks), which at 100 Mbit/s bounds the
    # throughput far below what the same model trains at on one node.
    parameters = 1024 * 1024 + 1024 + 1024 * 10 + 10
    bound = case["global_batch"] / (parameters * 4 * 8 / 100e6)
    assert case["samples_per_s"] < 1.15 * bound, (case["samples_per_s"], bound)

    # Nothing of the session's is left running, and nothing was made in the root namespace.
    if os.geteuid() == 0:
        deadline = time.monotonic() + 10
        while (left := [p.pid for p in psutil.process_iter(["uids"])
                        if p.info["uids"] and p.info["uids"].real == NOBODY]) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == []
    assert fabric.leftovers() == before
