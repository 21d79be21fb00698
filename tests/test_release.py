"""What a new user gets first: the wheel a release publishes (.github/workflows/release.yml
installs it and runs `pytest --help`; here its contents are checked without installing)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pytest_dlperf"


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
    for name in ("pyproject.toml", "README.md"):
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
