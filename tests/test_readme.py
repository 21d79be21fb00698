"""The front door: what a newcomer reads first must be short, say how to use the plugin in a
project of their own before how to develop this one, point to the own-model example, and tell
the truth about what the setup script installs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def heading_line(title: str) -> int:
    lines = README.splitlines()
    return next(i for i, line in enumerate(lines) if line.startswith("## ") and title in line)


def test_the_readme_is_a_front_door_not_a_notebook() -> None:
    assert len(README.splitlines()) <= 250


def test_installing_into_your_own_project_comes_before_the_repositorys_quick_start() -> None:
    install = heading_line("Install into your project")
    assert install < heading_line("Quick start")
    section = "\n".join(README.splitlines()[install:heading_line("Quick start")])
    assert "pip install 'pytest-dlperf[torch]'" in section and "pytest perf_tests" in section


def test_the_own_model_example_is_pointed_to_from_the_top() -> None:
    top = "\n".join(README.splitlines()[:15])
    assert "(#your-own-model)" in top
    assert heading_line("Your own model") < 120


def test_the_readme_names_the_extras_the_setup_script_installs() -> None:
    setup = (ROOT / "scripts" / "setup").read_text(encoding="utf-8")
    (extras,) = re.findall(r'pip -e "\.\[([^\]]+)\]"', setup)
    assert f'pip install -e ".[{extras}]"' in README
    assert not re.search(r'pip install -e "\.\[(?!' + re.escape(extras) + r'\])[^\]]*\]"', README)


def test_the_old_command_spellings_are_accounted_for() -> None:
    """The commands moved to `python -m pytest_dlperf`: the README says which old one still
    works and which is gone."""
    assert "python -m pytest_dlperf.report" in README
    assert "python -m pytest_dlperf.history" in README


def test_every_extra_a_user_installs_is_in_the_readmes_install_list_and_the_install_page(
        ) -> None:
    """Issue 74: the README's install list had no `[ray]` (its launcher needs it)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    # test and docs are this repository's own (scripts/setup, scripts/check-docs)
    offered = set(project["optional-dependencies"]) - {"test", "docs"}
    block = README[README.index("```bash", README.index("## Install")):]
    block = block[:block.index("```", 7)]
    listed = {e.strip() for extras in re.findall(r"\[([a-z,-]+)\]", block)
              for e in extras.split(",")}
    assert offered <= listed, f"extras missing from the README's install list: {offered - listed}"
    page = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([a-z-]+)` \|", page, re.M))
    assert offered <= rows, f"extras missing from docs/install.md's table: {offered - rows}"
