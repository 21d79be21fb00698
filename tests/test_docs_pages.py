"""The site's pages for a newcomer: the first-test and own-model pages carry the README's
own-model file word for word (tests/test_own_model.py runs the README's, so the page's runs too), and Install and
Your first perf test come right after the overview in the site's navigation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def first_python_block(path: Path, after: str = "") -> str:
    text = path.read_text(encoding="utf-8")
    start = text.index(after) if after else 0
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None, f"no python block in {path.name} after {after!r}"
    return match.group(1)


@pytest.mark.parametrize("page", ["first-test.md", "own-model.md"])
def test_the_pages_show_the_readmes_own_model_file(page: str) -> None:
    readme = first_python_block(ROOT / "README.md", after="\n## Your own model\n")
    shown = first_python_block(ROOT / "docs" / page)
    assert shown == readme, f"docs/{page}'s test file drifted from the README's"


def test_install_and_first_test_follow_the_overview_in_the_nav() -> None:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    pages = [next(iter(entry.values())) for entry in nav]
    assert pages[:3] == ["index.md", "install.md", "first-test.md"]


def test_the_overview_sends_newcomers_to_the_site_not_the_readme() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert "(install.md)" in index and "(first-test.md)" in index
    assert "README" not in index
