"""Options: one group, ini twins, precedence command line > environment > ini, clear usage errors."""

from __future__ import annotations

import sys

import pytest

from pytest_dlperf.launch.ray import hooks as ray_hooks
from pytest_dlperf.plugin.options import OPTIONS
from pytest_dlperf.plugin.settings import default_machine

SHOW_SETTINGS = """
from pytest_dlperf.plugin import STATE

def test_show(request):
    s = request.config.stash[STATE].settings
    p = s.protocol
    print(f"SETTINGS {p.name} {p.warmup_steps} {p.steps} {p.repeats} {s.tolerance} {s.nodes} "
          f"{s.devices_per_node} {s.update_baselines} {s.strict} {s.baselines.name} "
          f"{s.max_repeats} {s.unstable_cv} {s.batch_size} {s.launches} {s.machine} "
          f"{s.baseline_launches}")
"""


def settings_line(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makepyfile(test_show=SHOW_SETTINGS)
    result = pytester.runpytest("-s", *args)
    result.assert_outcomes(passed=1)
    line = next(x for x in result.outlines if "SETTINGS" in x)
    return line.split("SETTINGS", 1)[1].split()


def test_defaults_are_the_full_dlperf_protocol(pytester: pytest.Pytester,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DLPERF_PROTOCOL", raising=False)
    monkeypatch.delenv("DLPERF_MACHINE", raising=False)
    assert settings_line(pytester) == ["full", "20", "100", "7", "0.05", "1", "None", "None",
                                       "False", "baselines", "21", "0.1", "None", "3",
                                       default_machine(), "20"]


def test_quick_profile_and_overrides(pytester: pytest.Pytester) -> None:
    got = settings_line(pytester, "--dlperf-protocol", "quick", "--dlperf-steps", "3",
                        "--nodes", "2", "--devices-per-node", "1", "--dlperf-tolerance", "10%",
                        "--dlperf-update-baselines", "--dlperf-strict", "--dlperf-baselines", "b2",
                        "--dlperf-max-repeats", "5", "--dlperf-unstable-cv", "20%",
                        "--dlperf-batch-size", "48", "--dlperf-launches", "5",
                        "--dlperf-machine", "gpu-runner_7.a", "--dlperf-baseline-launches", "9")
    assert got == ["quick+custom", "5", "3", "5", "0.1", "2", "1", "all", "True", "b2", "5", "0.2",
                   "48", "5", "gpu-runner_7.a", "9"]
    assert settings_line(pytester, "--dlperf-protocol", "quick")[10] == "15"  # 3 x repeats
    assert settings_line(pytester, "--dlperf-update-baselines=missing")[7] == "missing"
    assert settings_line(pytester, "--dlperf-update-baselines=add")[7] == "add"


def test_the_default_machine_is_a_valid_stable_name() -> None:
    """What the store files baselines under when no --dlperf-machine is given: a name the
    option itself would accept, the same in every process on this host."""
    import subprocess
    import sys

    from pytest_dlperf.plugin.options import _machine_name

    name = default_machine()
    assert _machine_name(name) == name
    again = subprocess.run([sys.executable, "-c", "from pytest_dlperf.plugin.settings import "
                            "default_machine; print(default_machine())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert again == name


def test_precedence_cli_over_env_over_ini(pytester: pytest.Pytester,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\ndlperf_steps = 7\ndlperf_repeats = 2\ndlperf_warmup_steps = 1\n"
                     "dlperf_batch_size = 24\n")
    assert settings_line(pytester)[1:4] == ["1", "7", "2"]
    assert settings_line(pytester)[12] == "24"
    assert settings_line(pytester, "--dlperf-batch-size", "32")[12] == "32"
    monkeypatch.setenv("DLPERF_STEPS", "9")
    assert settings_line(pytester)[1:4] == ["1", "9", "2"]
    assert settings_line(pytester, "--dlperf-steps", "11")[1:4] == ["1", "11", "2"]


@pytest.mark.parametrize("args, names", [
    (["--nodes", "0"], "--dlperf-nodes/--nodes=0"),
    (["--nodes", "-2"], "--dlperf-nodes/--nodes=-2"),
    (["--nodes", "two"], "--dlperf-nodes/--nodes=two"),
    (["--nodes", "1.5"], "--dlperf-nodes/--nodes=1.5"),
    (["--devices-per-node", "0"], "--dlperf-devices-per-node/--devices-per-node=0"),
    (["--dlperf-steps", "abc"], "--dlperf-steps=abc"),
    (["--dlperf-batch-size", "0"], "--dlperf-batch-size=0"),
    (["--dlperf-repeats", "0"], "--dlperf-repeats=0"),
    (["--dlperf-warmup-steps", "-1"], "--dlperf-warmup-steps=-1"),
    (["--dlperf-tolerance", "2"], "--dlperf-tolerance=2"),
    (["--dlperf-tolerance", "fast"], "--dlperf-tolerance=fast"),
    (["--dlperf-protocol", "slow"], "--dlperf-protocol=slow"),
    (["--dlperf-timeout", "0"], "--dlperf-timeout=0"),
    (["--dlperf-device", "tpu"], "--dlperf-device=tpu"),
    (["--dlperf-max-repeats", "0"], "--dlperf-max-repeats=0"),
    (["--dlperf-repeats", "5", "--dlperf-max-repeats", "4"], "--dlperf-max-repeats=4"),
    (["--dlperf-unstable-cv=-5%"], "--dlperf-unstable-cv=-5%"),
    (["--dlperf-unstable-cv", "inf"], "--dlperf-unstable-cv=inf"),
    (["--dlperf-python", "/usr/bin/python3"], "--dlperf-python=/usr/bin/python3"),
    (["--dlperf-python", "oneflow="], "--dlperf-python=oneflow="),
    (["--dlperf-python", "one-flow=/usr/bin/python3"], "--dlperf-python=one-flow=/usr/bin/python3"),
    (["--dlperf-python", "oneflow=a,oneflow=b"], "--dlperf-python=oneflow=a,oneflow=b"),
    (["--dlperf-python", "oneflow=no/such/python"], "--dlperf-python=oneflow=no/such/python"),
    (["--dlperf-launches", "0"], "--dlperf-launches=0"),
    (["--dlperf-baseline-launches", "1"], "--dlperf-baseline-launches=1"),
    (["--dlperf-update-baselines", "append"], "--dlperf-update-baselines=append"),
    (["--dlperf-machine", "my box"], "--dlperf-machine=my box"),
    (["--dlperf-machine", "../elsewhere"], "--dlperf-machine=../elsewhere"),
])
def test_bad_values_are_usage_errors_naming_the_flag(pytester: pytest.Pytester, args: list[str],
                                                     names: str) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-dlperf: bad value for {names}*"])
    assert "Traceback" not in result.stderr.str()


def test_bad_env_and_ini_values_say_where_they_came_from(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    monkeypatch.setenv("DLPERF_REPEATS", "many")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*environment variable DLPERF_REPEATS='many'*integer*"])
    monkeypatch.delenv("DLPERF_REPEATS")
    pytester.makeini("[pytest]\ndlperf_tolerance = lots\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini key dlperf_tolerance = 'lots' in *tox.ini*fraction*"])


def test_markers_are_registered_for_strict_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="""
        import pytest

        @pytest.mark.multinode
        @pytest.mark.dlperf(tolerance=0.03)
        def test_x():
            pass
    """)
    pytester.runpytest("--strict-markers", "-m", "multinode").assert_outcomes(passed=1)
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.multinode:*", "@pytest.mark.dlperf(tolerance=None, memory_tolerance=None, min_mfu=None)*"])


def test_help_shows_the_dlperf_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["deep-learning training throughput (pytest-dlperf):",
                                 "*--dlperf-warmup-steps=N*", "*--dlperf-nodes=N, --nodes=N*",
                                 "*--dlperf-devices-per-node=N, --devices-per-node=N*",
                                 "*dlperf_tolerance (string)*"])



def test_help_names_each_options_environment_variable_and_ini_key(
        pytester: pytest.Pytester) -> None:
    """``--help`` used to name neither ``DLPERF_*`` nor the ini keys beside a flag. Each
    option's entry (its lines up to the next option, argparse's wrapping undone) says both."""
    result = pytester.runpytest("--help")
    lines = result.stdout.lines
    start = lines.index("deep-learning training throughput (pytest-dlperf):")
    entries: dict[str, str] = {}
    flag = None
    for line in lines[start + 1:]:
        if not line.strip():
            break  # the group's end
        if line.startswith("  --"):
            flag = line.split()[0].split("=")[0].rstrip(",")
            entries[flag] = ""
        assert flag is not None
        entries[flag] += " " + line
    # The plugin's table, and the option the Ray launcher registers itself (launch/ray/hooks.py)
    spellings = {opt.cli: (opt.env, opt.dest) for opt in OPTIONS}
    spellings[ray_hooks.FLAG] = (ray_hooks.ENV, ray_hooks.INI)
    assert sorted(entries) == sorted(spellings)
    for cli, (env, ini) in spellings.items():
        entry = " ".join(entries[cli].split())
        assert f"[env {env}; ini {ini}]" in entry, entry

def test_worker_interpreters_resolve_against_where_they_were_given(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_show="""
        from pytest_dlperf.plugin import STATE

        def test_show(request):
            print("PYTHONS", request.config.stash[STATE].settings.python)
    """)
    python = pytester.path / "envs" / "py310"
    python.parent.mkdir()
    python.symlink_to(sys.executable)  # a working Python: the plugin runs it to check
    (pytester.path / "envs" / "data").write_text("not a program")
    pytester.makeini("[pytest]\ndlperf_python = oneflow=envs/py310\n")
    result = pytester.runpytest("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*PYTHONS {{'oneflow': '{python}'}}"])
    result = pytester.runpytest("-s", "--dlperf-python", "oneflow=envs/data")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dlperf-python=oneflow=envs/data*oneflow's interpreter "
                                 "*envs/data is not an executable file*setup-oneflow*"])
    # The flag given once a framework, as users combine two own interpreters: both kept (the
    # last alone was, silently: the other framework's cases then skipped for want of one).
    result = pytester.runpytest("-s", "--dlperf-python", "oneflow=envs/py310",
                                "--dlperf-python", "mindspore=envs/py310")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*PYTHONS {{'oneflow': '{python}', 'mindspore': '{python}'}}"])
    result = pytester.runpytest("-s", "--dlperf-python", "oneflow=envs/py310",
                                "--dlperf-python", "oneflow=envs/data")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dlperf-python=oneflow=envs/py310,oneflow=envs/data*"
                                 "oneflow is given twice*"])


@pytest.mark.parametrize("marker, complaint", [
    ("dlperf(tolerence=0.1)",
     "unknown keyword 'tolerence' (known: tolerance, memory_tolerance, min_mfu)"),
    ("dlperf(0.1)", "takes keywords only (known: tolerance, memory_tolerance, min_mfu), got 1 "
                    "positional argument"),
    ("dlperf(tolerance='lots')", "tolerance='lots': expected a fraction*"),
])
def test_a_bad_dlperf_marker_is_refused_naming_the_test_and_the_known_keywords(
        pytester: pytest.Pytester, marker: str, complaint: str) -> None:
    pytester.makepyfile(test_x=f"""
        import pytest

        @pytest.mark.{marker}
        def test_x():
            pass

        def test_y():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_x.py::test_x: @pytest.mark.dlperf*{complaint}*"])
