"""The nightly's bad input (issue 74): tests outside a git checkout, and pytest arguments that
pytest refuses, exit 2 saying why and write nothing: no summary, no results folder, no store, no
kept environment. Real ``scripts/nightly`` and ``dlperf nightly run`` processes; nothing
trains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_ab import git

REPO = Path(__file__).resolve().parents[1]
TEST = '''
import pytest

@pytest.mark.layouts("dp", "tp")
def test_mlp(cluster, layout, throughput_meter):
    pass
'''


def environ(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    env.update(DLPERF_NIGHTLY_PYTHON=sys.executable, DLPERF_MACHINE="runner",
               DLPERF_NIGHTLY_STORE=str(tmp_path / "store"),
               DLPERF_NIGHTLY_OUT=str(tmp_path / "out"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    return env


def written(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name in ("store", "out"))


def test_tests_outside_a_git_checkout_are_refused_and_nothing_is_written(
        tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_mine.py").write_text(TEST)
    done = subprocess.run([str(REPO / "scripts" / "nightly"), str(tests), "-k", "1n1d"],
                          capture_output=True, text=True, env=environ(tmp_path), cwd=tmp_path,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "is not in a git checkout" in done.stderr
    assert written(tmp_path) == [], "a usage error wrote the nightly's folders"
    # the machine the store is filed under is said, not only the runner's host name
    assert "machine runner" in done.stderr


def test_arguments_pytest_refuses_exit_2_before_anything_is_kept(tmp_path: Path) -> None:
    repo = tmp_path / "team"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "test_mine.py").write_text(TEST)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tests")
    env = environ(tmp_path)
    for args, says in ((["--dlperf-layouts", "tp3", "--devices-per-node", "2"],
                        "layout 'tp3' divides none"),
                       (["-k", "no_such_case"], "they select no test")):
        done = subprocess.run([sys.executable, "-m", "pytest_dlperf", "nightly", "run", "--",
                               str(repo), *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=300, stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done.stderr
        assert "pytest refused tonight's arguments" in done.stderr and says in done.stderr
        assert written(tmp_path) == [], f"{args}: the refused night wrote its folders"
