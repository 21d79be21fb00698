"""Memory on the worker side, for real: this process's resettable peak RSS, a per-rank limit the
OS enforces, and how frameworks' out-of-memory errors are recognised."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_dlperf.core import cgroup, units
from pytest_dlperf.rank import memory

MiB = 2 ** 20
REPO = Path(__file__).resolve().parents[1]


def test_the_peak_of_a_window_sees_an_allocation_freed_before_it_ended() -> None:
    peak = memory.RssPeak()
    if not peak.resettable:
        pytest.skip("/proc/self/clear_refs is not writable here: only the lifetime peak exists")
    peak.reset()
    before = peak.peak()
    # Fresh pages from the kernel, each one written: an allocation through malloc can be served
    # from memory the process already holds (after earlier tests in this process freed theirs,
    # a 200 MiB bytearray once left the peak where it was).
    ballast = mmap.mmap(-1, 200 * MiB)
    for offset in range(0, 200 * MiB, mmap.PAGESIZE):
        ballast[offset] = 1
    ballast.close()
    assert peak.peak() - before >= 190 * MiB
    peak.reset()  # the next window starts from what is resident now
    assert peak.peak() - before < 50 * MiB


def test_frameworks_out_of_memory_errors_are_recognised() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as raised:
        torch.empty(1 << 60, dtype=torch.uint8)  # what torch raises when an allocation fails
    assert memory.is_out_of_memory(raised.value)
    assert memory.is_out_of_memory(MemoryError())
    try:
        try:
            raise MemoryError("inner")
        except MemoryError as inner:
            raise RuntimeError("the step failed") from inner
    except RuntimeError as outer:
        assert memory.is_out_of_memory(outer)  # through the cause chain
    assert not memory.is_out_of_memory(RuntimeError("Expected all tensors on the same device"))
    assert not memory.is_out_of_memory(ValueError("shape mismatch"))


@pytest.mark.parametrize(("text", "size"), [("2G", 2 << 30), ("1536M", 1536 * MiB),
                                            ("2GiB", 2 << 30), ("1.5g", 3 << 29),
                                            ("104857600", 100 * MiB)])
def test_sizes_parse_in_binary_units(text: str, size: int) -> None:
    assert units.parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "", "12X", "100K"])
def test_bad_sizes_say_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match="2G|1 MiB"):
        units.parse_size(text)


ALLOCATE = """
import json, sys
from pytest_dlperf.core.cgroup import apply_limit
applied = apply_limit(int(sys.argv[1]), sys.argv[2], 0, batch_size=7)
print(json.dumps(applied), flush=True)
try:
    ballast = bytearray(int(sys.argv[3]))  # zero-filled: every page touched
except MemoryError:
    print("MemoryError", flush=True)
    sys.exit(3)
print("allocated", flush=True)
"""


def test_a_rank_over_its_limit_is_stopped_by_the_os_and_the_kill_is_told_apart(
        tmp_path: Path) -> None:
    out = tmp_path / "run" / "results"
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", ALLOCATE, str(200 * MiB), str(out),
                           str(600 * MiB)], capture_output=True, text=True, env=env, timeout=60)
    applied = json.loads(done.stdout.splitlines()[0])
    assert json.loads(Path(cgroup.limit_file(str(out), 0)).read_text()) == applied
    assert applied["limit_bytes"] == 200 * MiB and applied["batch_size"] == 7
    assert "allocated" not in done.stdout
    if applied["mechanism"].startswith("cgroup"):
        assert done.returncode == -9  # the cgroup's OOM killer
        assert cgroup.oom_kills(applied) >= 1
        cgroup.release(applied)
        assert not Path(applied["path"]).exists()
    else:  # an address-space limit: the allocation itself fails
        assert (applied["mechanism"], done.returncode) == ("rlimit-as", 3)
        assert cgroup.oom_kills(applied) == 0

    # Within the limit, nothing is killed.
    within = subprocess.run([sys.executable, "-c", ALLOCATE, str(400 * MiB), str(out),
                             str(100 * MiB)], capture_output=True, text=True, env=env, timeout=60)
    assert within.returncode == 0 and "allocated" in within.stdout
    applied = json.loads(within.stdout.splitlines()[0])
    assert cgroup.oom_kills(applied) == 0
    cgroup.release(applied)
