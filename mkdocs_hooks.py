"""mkdocs hook: the site's home page is README.md, with its ``docs/`` links made relative to the
site, so the README and the home page are one text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

README = Path(__file__).parent / "README.md"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace docs/index.md's placeholder with the README."""
    if page.file.src_uri != "index.md":
        return markdown
    return README.read_text().replace("](docs/", "](")
