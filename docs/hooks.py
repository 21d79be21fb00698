"""MkDocs hook: the options reference, rendered from the plugin's own option table when the site
is built, so the site says what `pytest --help` says and nothing generated is committed.

`docs/options.md` holds the page's introduction and a placeholder comment; this hook replaces
the placeholder with `options_markdown()`, which `python -m pytest_dlperf options` prints too.
The hook imports the package: build with the repository installed, or with `PYTHONPATH` at its
root.
"""

from __future__ import annotations

from typing import Any

from mkdocs.exceptions import PluginError

PAGE = "options.md"
PLACEHOLDER = "<!-- dlperf-options: the reference is rendered here at build time (docs/hooks.py) -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if PLACEHOLDER not in markdown:
        raise PluginError(f"docs/{PAGE} lost its placeholder {PLACEHOLDER!r}: "
                          "the options reference has nowhere to go")
    try:
        from pytest_dlperf.plugin.options import options_markdown
    except ImportError as exc:
        raise PluginError(f"cannot render the options reference ({exc}): build with the "
                          "repository installed, or with PYTHONPATH at its root") from exc
    return markdown.replace(PLACEHOLDER, options_markdown())
