"""What a new user gets first: the wheel a release publishes (.github/workflows/release.yml
installs it and runs `pytest --help`; here its contents are checked without installing), and
scripts/perf, the repository's try-it command, which picks the quick protocol on a host
without a GPU unless told otherwise."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pytest_dlperf"
NO_GPU_LINE = ("scripts/perf: no GPU here: the quick protocol (5 warm-up, 10 steps x 5); "
               "pass --dlperf-protocol full for DLPerf's")
QUICK = ["--dlperf-protocol", "quick"]


# --- The wheel -------------------------------------------------------------------------------


def package_files(root: Path) -> set[str]:
    """Every file of the package a wheel must carry: sources and any data beside them."""
    return {p.relative_to(root).as_posix() for p in (root / PACKAGE).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """A wheel built from a copy of the source tree (a build in place would write build/ and
    egg-info into the checkout): what `python -m build` makes, less the sdist step."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / PACKAGE, source / PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(tmp / "dist"), str(source)],
                   check=True, capture_output=True, timeout=120)
    (built,) = (tmp / "dist").glob("pytest_dlperf-*.whl")
    return zipfile.ZipFile(built)


def dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if re.fullmatch(rf"[^/]+\.dist-info/{name}", n)]
    return wheel.read(path).decode()


def test_the_wheel_carries_every_file_of_the_package(wheel: zipfile.ZipFile) -> None:
    """Sources and package data alike: a data file setuptools is not told about (no
    MANIFEST.in, no package-data) would be missing from the wheel and fail only after
    installing from PyPI."""
    carried = {n for n in wheel.namelist() if n.startswith(f"{PACKAGE}/")}
    missing = package_files(ROOT) - carried
    assert not missing, f"files of the package missing from the wheel: {sorted(missing)}"


def test_the_wheel_carries_its_license(wheel: zipfile.ZipFile) -> None:
    """The package says Apache-2.0: the wheel states it (an SPDX expression) and carries the
    text."""
    metadata = dist_info(wheel, "METADATA")
    assert re.search(r"^License-Expression: Apache-2.0$", metadata, re.M)
    assert "Apache License" in dist_info(wheel, "licenses/LICENSE")
    assert "Version 2.0, January 2004" in dist_info(wheel, "licenses/LICENSE")


def test_the_wheel_registers_the_plugin_and_the_command(wheel: zipfile.ZipFile) -> None:
    entry_points = dist_info(wheel, "entry_points.txt")
    assert re.search(r"^\[pytest11\]\ndlperf = pytest_dlperf\.plugin$", entry_points, re.M)
    assert re.search(r"^\[console_scripts\]\ndlperf = pytest_dlperf\.cli:main$", entry_points,
                     re.M)


def test_the_wheel_offers_the_extras_the_install_lines_name(wheel: zipfile.ZipFile) -> None:
    """Every extra in the README's and the install page's pip lines exists, and no framework
    is required outright (pytest --help must not need one)."""
    metadata = dist_info(wheel, "METADATA")
    offered = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M))
    named = set()
    for page in (ROOT / "README.md", ROOT / "docs" / "install.md"):
        for extras in re.findall(r"pytest-dlperf\[([^\]]+)\]", page.read_text(encoding="utf-8")):
            named.update(e.strip() for e in extras.split(","))
    assert named and named <= offered, f"extras named but not offered: {named - offered}"
    required = {re.split(r"[\s<>=!;\[]", line.split(":", 1)[1].strip())[0].lower()
                for line in metadata.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert "pytest" in required
    assert not required & {"torch", "torchvision", "tensorflow", "tensorflow-cpu",
                           "paddlepaddle", "oneflow"}


# --- scripts/perf's protocol -----------------------------------------------------------------


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """scripts/perf in a stand-in checkout: stubs for scripts/setup, scripts/setup-oneflow,
    scripts/setup-mindspore, scripts/setup-mxnet and .venv/bin/python that only note they ran,
    so no test here sets anything up or trains."""
    executable(tmp_path / "scripts" / "perf", (ROOT / "scripts" / "perf").read_text())
    executable(tmp_path / "scripts" / "setup", "#!/bin/sh\ntouch setup-ran\n")
    executable(tmp_path / "scripts" / "setup-oneflow", "#!/bin/sh\necho /of/python\n")
    executable(tmp_path / "scripts" / "setup-mindspore", "#!/bin/sh\necho /ms/python\n")
    executable(tmp_path / "scripts" / "setup-mxnet", "#!/bin/sh\necho /mx/python\n")
    executable(tmp_path / ".venv" / "bin" / "python", "#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    return tmp_path


def perf(repo: Path, *args: str, gpu: bool = False, dry_run: bool = True,
         **env: str) -> subprocess.CompletedProcess[str]:
    """Runs scripts/perf with a fake nvidia-smi first on PATH (listing one H100, or none as a
    driver without a GPU does) and none of the caller's DLPERF_* variables."""
    bin_dir = repo / "fake-bin"
    listing = ('echo "GPU 0: NVIDIA H100 (UUID: GPU-x)"' if gpu
               else 'echo "No devices were found"; exit 6')
    executable(bin_dir / "nvidia-smi", f"#!/bin/sh\n{listing}\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    base["PATH"] = f"{bin_dir}{os.pathsep}{base['PATH']}"
    if dry_run:
        base["DLPERF_PERF_DRY_RUN"] = "1"
    return subprocess.run([str(repo / "scripts" / "perf"), *args], env={**base, **env},
                          capture_output=True, text=True, timeout=60, check=True)


def argv(run: subprocess.CompletedProcess[str]) -> list[str]:
    return run.stdout.splitlines()


def test_no_gpu_and_no_arguments_gives_the_quick_protocol_and_says_so(repo: Path) -> None:
    run = perf(repo)
    assert argv(run) == ["perf_tests", *QUICK]
    assert run.stderr.splitlines() == [NO_GPU_LINE]
    assert not (repo / "setup-ran").exists(), "the dry run must exit before scripts/setup"


@pytest.mark.parametrize("args, env", [
    (["--dlperf-protocol", "full"], {}),
    (["--dlperf-protocol=full"], {}),
    (["--dlperf-steps", "3"], {}),
    (["--dlperf-warmup-steps=2"], {}),
    (["--dlperf-repeats", "2"], {}),
    (["-o", "dlperf_protocol=full"], {}),
    ([], {"DLPERF_PROTOCOL": "full"}),
    ([], {"DLPERF_STEPS": "3"}),
], ids=["protocol", "protocol=", "steps", "warmup-steps=", "repeats", "ini", "env", "env-steps"])
def test_a_protocol_or_step_count_of_the_users_own_is_left_alone(
        repo: Path, args: list[str], env: dict[str, str]) -> None:
    run = perf(repo, "-k", "1n1d", *args, **env)
    assert argv(run) == ["perf_tests", "-k", "1n1d", *args]
    assert run.stderr == ""


def test_a_gpu_host_keeps_the_full_protocol(repo: Path) -> None:
    run = perf(repo, "-k", "1n1d", gpu=True)
    assert argv(run) == ["perf_tests", "-k", "1n1d"]
    assert run.stderr == ""


def test_other_arguments_that_merely_mention_steps_do_not_count(repo: Path) -> None:
    run = perf(repo, "-k", "steps and protocol", "--dlperf-launches", "1")
    assert argv(run) == ["perf_tests", *QUICK, "-k", "steps and protocol", "--dlperf-launches",
                         "1"]


def test_the_real_run_passes_the_same_protocol_to_pytest(repo: Path) -> None:
    """Not dry: scripts/setup runs, then pytest (the stub interpreter prints its arguments)
    gets the quick protocol, OneFlow's interpreter and the user's arguments."""
    run = perf(repo, "-k", "1n1d", dry_run=False)
    assert (repo / "setup-ran").exists()
    assert argv(run) == ["-m", "pytest", "perf_tests", *QUICK,
                         "--dlperf-python", "oneflow=/of/python,mindspore=/ms/python,mxnet=/mx/python",
                         "-k",
                         "1n1d"]
    assert NO_GPU_LINE in run.stderr.splitlines()
