"""Live progress: the meter calls its hook only where it is not timing; a real run shows a plain
line per window where output is a pipe, one line rewritten in place on a real terminal (a
pseudo-terminal, read back through a terminal emulator), and nothing under -q."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
from numpy_mlp import ADAPTER, ONE

from pytest_dlperf.core.protocol import Protocol
from pytest_dlperf.rank.timing import measure

RUN = ["-p", "no:cacheprovider", "--devices-per-node", "1", "--dlperf-warmup-steps", "2",
       "--dlperf-steps", "2", "--dlperf-repeats", "4", "--dlperf-launches", "2",
       "--dlperf-unstable-cv", "10", "--dlperf-baselines", "bl", "--dlperf-json", "out.json"]


def test_the_progress_hook_runs_outside_the_timed_windows() -> None:
    """A clock that ticks 1 per training step and 1000 per progress call: the windows must
    come out at exactly their steps. The hook runs only right after a synchronization (the
    first warm-up step, the warm-up's end, each window), never beside queued work."""
    now = [0.0]
    calls: list[tuple[str, int, int, float | None]] = []
    queued = [0]  # steps the "device" has not finished

    def step() -> None:
        now[0] += 1
        queued[0] += 1

    def synchronize() -> None:
        queued[0] = 0

    def progress(phase: str, index: int, total: int, elapsed: float | None) -> None:
        assert queued[0] == 0, "progress beside queued work"
        calls.append((phase, index, total, elapsed))
        now[0] += 1000

    result = measure(Protocol(3, 5, 2), step, synchronize, clock=lambda: now[0],
                     progress=progress)
    assert [w.elapsed_s for w in result.windows] == [5.0, 5.0]
    assert calls == [("warmup", 1, 3, None), ("warmup", 3, 3, None),
                     ("window", 1, 2, 5.0), ("window", 2, 2, 5.0)]


def windows_of(path: Path) -> list[float]:
    (bench,) = json.loads(path.read_text())["benchmarks"]
    return bench["extra_info"]["samples_per_s_repeats"]


@pytest.mark.usefixtures("subprocess_env")
def test_a_pipe_gets_a_plain_line_per_window_and_q_gets_none(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_p=ONE, numpy_mlp_adapter=ADAPTER)
    result = pytester.runpytest_subprocess(*RUN, timeout=300)
    result.assert_outcomes(passed=1)
    lines = [line for line in result.outlines if line.startswith("pytest-dlperf: test_one ")]
    shown = [re.fullmatch(r"pytest-dlperf: test_one launch (\d)/2: window (\d)/2 ([\d,.]+) "
                          r"samples/s", line) for line in lines]
    assert all(shown), lines
    assert [(m.group(1), m.group(2)) for m in shown if m] == [
        ("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")]
    # each line's figure is that window's, as the results file has it (rank 0's own clock)
    measured = windows_of(pytester.path / "out.json")
    figures = [float(m.group(3).replace(",", "")) for m in shown if m]
    assert figures == pytest.approx(measured, rel=0.01, abs=0.01)

    quiet = pytester.runpytest_subprocess(*RUN, "-q", timeout=300)
    quiet.assert_outcomes(passed=1)
    assert not [line for line in quiet.outlines if ": window " in line or "launch 1/2" in line]


def run_in_terminal(args: list[str], cwd: Path, env: dict[str, str],
                    timeout_s: float = 300) -> bytes:
    """Run ``args`` with a pseudo-terminal (80 x 24) as its output; everything it wrote."""
    leader, follower = pty.openpty()
    import fcntl
    import struct
    import termios

    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(args, cwd=cwd, env={**env, "TERM": "xterm", "COLUMNS": "80"},
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    out = bytearray()
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], timeout_s)
            if not ready:
                raise TimeoutError(out.decode(errors="replace")[-2000:])
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        proc.wait(timeout=60)
        os.close(leader)
    return bytes(out)


@pytest.mark.usefixtures("subprocess_env")
def test_a_terminal_gets_one_line_rewritten_in_place_and_left_clean(
        pytester: pytest.Pytester) -> None:
    pyte = pytest.importorskip("pyte")
    pytester.makepyfile(test_p=ONE, numpy_mlp_adapter=ADAPTER)
    raw = run_in_terminal([sys.executable, "-m", "pytest", "test_p.py", *RUN],
                          pytester.path, dict(os.environ))
    text = raw.decode(errors="replace")
    # the live line went through every phase, in place (carriage return, erase line)
    live = re.findall(r"\r\x1b\[2K  \[dlperf\] test_one ([^\r\x1b]*)", text)
    assert live[0] == "launch 1/2: launching", live
    for phase in ("launch 1/2: rendezvous and model build", "launch 1/2: warm-up 2/2",
                  "launch 2/2: window 2/2 "):
        assert any(item.startswith(phase) for item in live), (phase, live)
    assert not [line for line in text.splitlines() if "pytest-dlperf: test_one launch" in line]
    # what the terminal shows at the end: pytest's own lines, no live line left over, the
    # test's line whole with its result and percentage
    screen = pyte.Screen(80, 400)
    stream = pyte.Stream(screen)
    stream.feed(text.replace("\n", "\r\n"))
    shown = [line.rstrip() for line in screen.display if line.strip()]
    assert not [line for line in shown if "[dlperf]" in line], shown
    assert any(re.fullmatch(r"test_p\.py \.\s+\[100%\]", line) for line in shown), shown
    assert any("1 passed" in line for line in shown), shown
