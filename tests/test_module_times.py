"""tests/module_times.py: the suite's time by module, in the terminal summary of a run, alone
and under pytest-xdist (the controller sums what its workers report)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CONFTEST = """
from module_times import ModuleTimes


def pytest_configure(config):
    config.pluginmanager.register(ModuleTimes(), "module-times")
"""


def listed(lines: list[str]) -> list[tuple[float, int, str]]:
    """The summary's module lines: seconds, tests, module."""
    start = next(i for i, line in enumerate(lines) if "time by module:" in line)
    found = []
    for line in lines[start + 1:]:
        match = re.fullmatch(r"\s*([\d.]+) s\s+(\d+) tests  (\S+)", line)
        if not match:
            break
        found.append((float(match[1]), int(match[2]), match[3]))
    return found


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["alone", "xdist"])
def test_modules_are_listed_longest_first_with_their_tests_and_fixtures(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: list[str]) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_slow="""
        import time
        import pytest

        @pytest.fixture(scope="module")
        def built():
            time.sleep(0.4)  # a module fixture: counted in its first test's setup

        def test_one(built):
            time.sleep(0.1)

        def test_two(built):
            time.sleep(0.1)
        """, test_quick="""
        import pytest

        def test_quick():
            pass

        @pytest.mark.skip(reason="no")
        def test_skipped():
            pass
        """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *workers)
    result.assert_outcomes(passed=3, skipped=1)
    (slow, slow_tests, first), (quick, quick_tests, second) = listed(result.outlines)
    assert (first, slow_tests) == ("test_slow.py", 2) and slow >= 0.6
    assert (second, quick_tests) == ("test_quick.py", 2) and quick < slow
