"""The command line (``python -m pytest_dlperf`` / ``dlperf``) and the plugin's own hook."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SUBCOMMANDS = ("report", "html", "history", "options")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [[sys.executable, "-m", "pytest_dlperf"],
                                     [str(Path(sys.executable).parent / "dlperf")]],
                         ids=["python -m pytest_dlperf", "dlperf"])
def test_help_lists_the_subcommands(command: list[str]) -> None:
    done = run(*command, "--help")
    assert done.returncode == 0, done.stderr
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in done.stdout, (name, done.stdout)


def test_no_subcommand_is_a_usage_error_listing_them() -> None:
    done = run(sys.executable, "-m", "pytest_dlperf")
    assert done.returncode == 2
    assert "required: COMMAND" in done.stderr or "the following arguments are required" in done.stderr


def test_options_prints_every_option_of_the_table() -> None:
    from pytest_dlperf.plugin.options import OPTIONS

    done = run(sys.executable, "-m", "pytest_dlperf", "options")
    assert done.returncode == 0, done.stderr
    for opt in OPTIONS:
        assert f"## `{opt.cli}`" in done.stdout and f"`{opt.env}`" in done.stdout
    assert "## `--dlperf-compilers`" in done.stdout


def test_the_old_report_spelling_works_and_says_what_replaced_it(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"benchmarks": []}))
    done = run(sys.executable, "-m", "pytest_dlperf.report", str(results))
    assert done.returncode == 0, done.stderr
    assert "No pytest-dlperf cases ran." in done.stdout
    assert "deprecated" in done.stderr and "python -m pytest_dlperf report" in done.stderr


def test_a_conftest_answers_the_commit_info_hook(pytester: pytest.Pytester) -> None:
    """The results file (and with it the baselines and the history) takes the commit from
    ``pytest_dlperf_commit_info``: a conftest's answer wins over git's."""
    pytester.makeconftest("""
        def pytest_dlperf_commit_info(config):
            return {"id": "f" * 40, "dirty": False, "branch": "from-ci", "project": "mine"}
    """)
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dlperf-json", "r.json")
    result.assert_outcomes(passed=1)
    data = json.loads((pytester.path / "r.json").read_text())
    assert data["commit_info"] == {"id": "f" * 40, "dirty": False, "branch": "from-ci",
                                   "project": "mine"}
