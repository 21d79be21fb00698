"""Where a run of the suite spent its time, by test module: each module's worker-seconds (the
setup, call and teardown of its tests, summed) at the end of the run's terminal summary, the
longest first. What ``conftest.LONGEST_FIRST``'s figures and docs/development.md's profile of
CI are read from: pytest's ``--durations`` names tests, and a module's time is spread over many
(its module-scoped fixtures in its first test's setup). Under pytest-xdist the controller sums
the reports its workers send; the workers print nothing."""

from __future__ import annotations

import pytest

SHOWN = 30  # modules listed; the rest are summed on one line


class ModuleTimes:
    """The plugin: registered by ``tests/conftest.py`` for the suite's own runs."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.times.setdefault(report.nodeid.split("::")[0], [0.0, 0])
        entry[0] += report.duration
        entry[1] += report.when == "call" or (report.when == "setup" and report.skipped)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter,
                                config: pytest.Config) -> None:
        if hasattr(config, "workerinput") or not self.times:
            return
        ranked = sorted(self.times.items(), key=lambda item: -item[1][0])
        total = sum(seconds for seconds, _ in self.times.values())
        terminalreporter.write_sep("=", f"time by module: {total:,.0f} worker-seconds")
        for module, (seconds, tests) in ranked[:SHOWN]:
            terminalreporter.write_line(f"{seconds:8.1f} s {int(tests):5d} tests  {module}")
        rest = ranked[SHOWN:]
        if rest:
            terminalreporter.write_line(f"{sum(e[0] for _, e in rest):8.1f} s "
                                        f"{int(sum(e[1] for _, e in rest)):5d} tests  "
                                        f"({len(rest)} more modules)")
