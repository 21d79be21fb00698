"""The documentation check (scripts/check-docs, which scripts/test runs) fails on a warning: a
broken anchor, a link to a missing page. Before, ``mkdocs build --strict --quiet`` passed both:
--quiet dropped the warnings before --strict counted them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scripts" / "check-docs"

pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]') builds the site")


def check(config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run([str(CHECK), str(config)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A copy of the repository's site (mkdocs.yml and docs/) to break."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def test_scripts_test_runs_the_docs_check() -> None:
    lines = (ROOT / "scripts" / "test").read_text().splitlines()
    assert any(line.strip().startswith("scripts/check-docs") for line in lines)
    assert not any("mkdocs build" in line and not line.lstrip().startswith("#")
                   for line in lines), "scripts/test builds the site only through check-docs"


def test_the_site_as_committed_passes(site: Path) -> None:
    done = check(site / "mkdocs.yml")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("target, named", [
    ("measurements.md#no-such-heading", "does not contain an anchor '#no-such-heading'"),
    ("no-such-page.md", "not found"),
], ids=["anchor", "page"])
def test_a_broken_link_fails_the_check(site: Path, target: str, named: str) -> None:
    page = site / "docs" / "ab.md"
    page.write_text(page.read_text() + f"\nSee [this]({target}).\n")
    done = check(site / "mkdocs.yml")
    assert done.returncode != 0
    assert named in done.stderr and "ab.md" in done.stderr
    assert "has warnings" in done.stderr
