from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from module_times import ModuleTimes
from snippets import (
    jax_interpreter,
    mindspore_interpreter,
    mxnet_interpreter,
    oneflow_interpreter,
)

from pytest_dlperf.core import topology

pytest_plugins = "pytester"

REPO = Path(__file__).resolve().parents[1]

# The child pytest runs of this suite (pytester's, scripts/nightly's, the plain subprocess ones:
# ~100 in all) need no Hypothesis, whose plugin imports the whole library in its terminal
# summary: 1.7 s of every child run here (measured with cProfile), ~3 min of the suite. Nor
# anyio's plugin: 0.15 s of one core a child session (its 30 modules' asserts rewritten at each
# start where PYTHONDONTWRITEBYTECODE is set; 2.8 against 2.95 s of a collecting session,
# 2026-12-07).
CHILD_ADDOPTS = " ".join(filter(None, [os.environ.get("PYTEST_ADDOPTS", ""),
                                       "-p no:hypothesispytest", "-p no:anyio"]))
os.environ["PYTEST_ADDOPTS"] = CHILD_ADDOPTS  # read by this run already; children inherit it

# Hypothesis's checks on its own speed (an example within 200 ms, inputs drawn fast enough) are
# checks on the machine's load, which scripts/test shares between two workers: a round trip of
# the baseline schema failed "input generation is slow" there (2 inputs in 1.24 s). The
# properties themselves are what the suite checks.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


# The modules that take longest in scripts/test's first pass (seconds of one worker, a slow VM,
# 2026-11-28), handed to its two workers first (--no-loadscope-reorder keeps this order):
# pytest-xdist's own order, by the number of tests in a module, handed the Slurm cluster's 8
# jobs (~5 minutes) and TensorFlow's 7 tests (~3) out among the last, and the pass's last 15
# tests took 3.5 of its 27 minutes: a long module late keeps one worker busy while the other
# has nothing left. The rest follow in collection order.
LONGEST_FIRST = (  # worker-seconds in CI's first pass (tests/module_times.py), 2026-12-07
    "test_conformance_measured.py",  # ~340 s (its own models on two nodes, six batch searches)
    "test_slurm_cluster.py",  # ~230 s (every framework's Slurm job, and the faults)
    "test_ray_cluster.py",  # ~175 s (with its faults)
    "test_conformance.py",  # ~150 s (TensorFlow's eager averages back)
    "test_layouts_torch.py",  # ~100 s (its 4-rank job of 23 worlds)
    "test_bad_inputs.py",  # ~95 s
    "test_ports.py",  # ~95 s (every framework's static job)
    "test_ports_ranks.py",  # ~90 s (every port's two-rank job)
    "test_tensorflow.py",  # ~85 s
    "test_ports_trained.py",  # ~75 s
    "test_oneflow.py",  # ~70 s
)


def pytest_configure(config: pytest.Config) -> None:
    # Each module's worker-seconds at the end of a run (tests/module_times.py): what
    # LONGEST_FIRST's figures are read from.
    config.pluginmanager.register(ModuleTimes(), "module-times")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: modules whole


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytest's own, with the children's options back (it clears PYTEST_ADDOPTS)."""
    monkeypatch.setenv("PYTEST_ADDOPTS", CHILD_ADDOPTS)
    return pytester


FAKE_SRUN = r"""#!/usr/bin/env bash
# Fake srun: one task per requested node, all on this host; logs how it was called.
echo "srun $*" >> "$FAKE_SLURM_LOG"
nodes=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes=*) nodes=${1#--nodes=} ;;
    -N|--nodes) nodes=$2; shift ;;
    -*) ;;
    *) break ;;
  esac
  shift
done
pids=()
trap 'kill "${pids[@]}" 2>/dev/null' TERM INT
for ((i = 0; i < nodes; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i "$@" &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit $rc
"""

FAKE_SCONTROL = r"""#!/usr/bin/env bash
# Fake scontrol: every allocated node is this host.
[ "$1 $2" = "show hostnames" ] || { echo "fake scontrol: only 'show hostnames'" >&2; exit 1; }
for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do echo localhost; done
"""


@pytest.fixture
def fake_hardware(monkeypatch: pytest.MonkeyPatch,
                  tmp_path_factory: pytest.TempPathFactory) -> Callable[..., topology.Hardware]:
    """The one hardware fake: replaces every detection source topology reads (NVML devices,
    CPU model, usable cores), for in-process pytester runs and direct calls alike; with
    ``slurm_nodes`` it also fakes a Slurm allocation (environment, ``srun`` and ``scontrol`` on
    PATH that start the agents on this host), which subprocess runs inherit."""

    def install(gpus: tuple[str, ...] = (), cpu_model: str = "Fake CPU 9000", cpu_count: int = 2,
                driver: str | None = None, slurm_nodes: int | None = None,
                cpu_bf16: bool = False) -> topology.Hardware:
        nvml = topology.NvmlDevices(tuple(gpus), tuple(80 * 2**30 for _ in gpus), driver)
        monkeypatch.setattr(topology, "_nvml_devices", lambda: nvml)
        monkeypatch.setattr(topology, "_cpu_bf16", lambda: cpu_bf16)
        monkeypatch.setattr(topology, "_cpu_model", lambda: cpu_model)
        monkeypatch.setattr(topology, "_cpu_count", lambda: cpu_count)
        if slurm_nodes is not None:
            bin_dir = tmp_path_factory.mktemp("fake-slurm")
            for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
                (bin_dir / name).write_text(text)
                (bin_dir / name).chmod(0o755)
            monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
            monkeypatch.setenv("FAKE_SLURM_LOG", str(bin_dir / "calls.log"))
            monkeypatch.setenv("SLURM_JOB_ID", "4242")
            monkeypatch.setenv("SLURM_JOB_NODELIST", f"node[1-{slurm_nodes}]")
            monkeypatch.setenv("SLURM_JOB_NUM_NODES", str(slurm_nodes))
        return topology.detect_hardware()

    return install


HANGING_ADAPTER = """
# A user adapter whose step never returns: a collective waiting on a peer forever, say.
import time

DISTRIBUTION = "torch"


class Hanging:
    def step(self):
        time.sleep(3600)  # a collective that never completes, say

    def synchronize(self):
        pass

    def loss(self):
        return 0.0

    def environment(self):
        return {}

    def close(self):
        pass


def build_trainer(spec, dist, recipe):
    return Hanging()
"""


@pytest.fixture
def hanging_adapter() -> Callable[[Path], str]:
    """Writes the adapter as ``fault_adapters.hanging`` under a folder; returns its dotted name."""

    def write(root: Path) -> str:
        (root / "fault_adapters").mkdir(exist_ok=True)
        (root / "fault_adapters" / "__init__.py").write_text("")
        (root / "fault_adapters" / "hanging.py").write_text(HANGING_ADAPTER)
        return "fault_adapters.hanging"

    return write


@pytest.fixture
def subprocess_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Environment for runpytest_subprocess: this interpreter's venv first, no stray DLPERF_*,
    and one launch per case (a launch costs 6-9 s here; the default 3 would triple the suite's
    time). Tests about launches pass --dlperf-launches, which outranks the variable."""
    for key in [k for k in os.environ if k.startswith("DLPERF_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("DLPERF_LAUNCHES", "1")
    # Other jobs share the machines this suite runs on: a case judged busy would fail tests
    # about other things. The busy check's own tests (test_busy.py) pass the flag, which
    # outranks the variable.
    monkeypatch.setenv("DLPERF_BUSY_THRESHOLD", "1")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    yield



@pytest.fixture(scope="module")
def oneflow_python() -> str:
    """OneFlow's worker interpreter (scripts/setup-oneflow's, or DLPERF_TEST_ONEFLOW_PYTHON);
    the test skips saying so without one."""
    path = oneflow_interpreter()
    if not os.access(path, os.X_OK):
        pytest.skip(f"no OneFlow interpreter at {path}: run scripts/setup-oneflow")
    return str(path)


@pytest.fixture(scope="module")
def mindspore_python() -> str:
    """MindSpore's worker interpreter (scripts/setup-mindspore's, or
    DLPERF_TEST_MINDSPORE_PYTHON); the test skips saying so without one."""
    path = mindspore_interpreter()
    if not os.access(path, os.X_OK):
        pytest.skip(f"no MindSpore interpreter at {path}: run scripts/setup-mindspore")
    return str(path)


@pytest.fixture(scope="module")
def mxnet_python() -> str:
    """MXNet's worker interpreter (scripts/setup-mxnet's, or DLPERF_TEST_MXNET_PYTHON); the test
    skips saying so without one."""
    path = mxnet_interpreter()
    if not os.access(path, os.X_OK):
        pytest.skip(f"no MXNet interpreter at {path}: run scripts/setup-mxnet")
    return str(path)


@pytest.fixture(scope="module")
def jax_python() -> str:
    """JAX's worker interpreter (scripts/setup-jax's, or DLPERF_TEST_JAX_PYTHON); the test skips
    saying so without one."""
    path = jax_interpreter()
    if not os.access(path, os.X_OK):
        pytest.skip(f"no JAX interpreter at {path}: run scripts/setup-jax")
    return str(path)


# -- a real PostgreSQL server, for the history store's tests -----------------------------------

def _postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL's binaries (apt-get install postgresql), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)
    return found[-1].parent if found else None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server of its own in a temporary folder (initdb, pg_ctl), on a free port
    of 127.0.0.1 with trust authentication; its URL without a database. Skips saying why where
    the server cannot start. Run as the ``postgres`` user when this is root (the server
    refuses root)."""
    import pwd
    import shutil
    import subprocess
    import tempfile

    from pytest_dlperf.core.ports import free_loopback_ports

    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin): "
                    "apt-get install postgresql")
    prefix: list[str] = []
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run the server as")
        prefix = ["runuser", "-u", "postgres", "--"]
    # Not under pytest's temporary folder: its parents are root's alone (mode 700), and the
    # server runs as postgres.
    folder = Path(tempfile.mkdtemp(prefix="dlperf-postgres-"))
    data, log = folder / "data", folder / "server.log"
    if owner is not None:
        shutil.chown(folder, owner.pw_uid, owner.pw_gid)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120)

    try:
        init = run(str(bin_dir / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres",
                   "--no-sync", "-E", "UTF8")
        if init.returncode != 0:
            pytest.skip(f"initdb failed: {init.stderr.strip()[-500:]}")
        (port,) = free_loopback_ports(1)
        options = f"-p {port} -k {folder} -h 127.0.0.1 -c fsync=off -c max_connections=50"
        start = run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options,
                    "-w", "-t", "60", "start")
        if start.returncode != 0:
            said = log.read_text()[-500:] if log.exists() else ""
            pytest.skip(f"the PostgreSQL server did not start: {start.stderr.strip()[-300:]} "
                        f"{said}")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}"
        finally:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A fresh, empty database on the session's server for this test."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{postgres_server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{postgres_server}/{name}"


@pytest.fixture(scope="session", autouse=True)
def nothing_of_the_nodes_network_left() -> Iterator[None]:
    """No namespace, link or blackhole route of a local node fabric (launch/onehost/fabric.py) survives
    the suite: every test that makes one (or SIGKILLs the pytest that made one) cleans up."""
    import shutil

    if not shutil.which("ip"):
        yield
        return
    from pytest_dlperf.launch.onehost import fabric

    before = fabric.leftovers()
    yield
    beside = os.environ.get("PYTEST_XDIST_WORKER") is not None  # another worker's tests run on

    def left() -> dict[str, list[str]]:
        after = fabric.leftovers()
        theirs = fabric.live_parts() if beside else set()
        return {kind: sorted(set(after[kind]) - set(before[kind]) - theirs) for kind in after}

    new = left()
    deadline = time.monotonic() + (30 if beside else 0)
    while any(new.values()) and time.monotonic() < deadline:
        time.sleep(1)  # a fabric being made names its parts in its record just after
        new = left()
    assert not any(new.values()), f"left on this machine by the test suite: {new}"


@pytest.fixture(scope="session", autouse=True)
def one_cache_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One user cache folder for every session the suite starts (pytester gives each test a HOME
    of its own, and its ~/.cache with it): a CPU's dense GEMM rate (MFU's peak, plugin/flops.py;
    ~16 s of a core here, most of it emulated bf16) is measured once a machine name for the
    whole run, its workers and ``scripts/test``'s two passes (``DLPERF_TEST_CACHE``), not once a
    test or a worker, and no test's folder gains a cache file."""
    before = os.environ.get("XDG_CACHE_HOME")
    shared = os.environ.get("DLPERF_TEST_CACHE")
    if shared:
        folder = Path(shared)
    elif os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' temporary folders' common root
        folder = tmp_path_factory.getbasetemp().parent / "xdg-cache"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("xdg-cache")
    os.environ["XDG_CACHE_HOME"] = str(folder)
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before
