"""mkdocs hook: the site's home page is README.md, with its ``docs/`` links made relative to the
site, so the README and the home page are one text; and the API reference's griffe extension."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from griffe import Extension, Object

README = Path(__file__).parent / "README.md"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace docs/index.md's placeholder with the README."""
    if page.file.src_uri != "index.md":
        return markdown
    return README.read_text().replace("](docs/", "](")


class SphinxRoles(Extension):
    """griffe extension (mkdocs.yml): the docstrings' Sphinx roles (``:class:`~a.b.C```) become
    code spans (`` `C` ``), as the reader of the site sees them; the docstrings are Google style
    otherwise (``Args:`` sections render as parameter tables)."""

    def on_instance(self, *, obj: Object, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_code, obj.docstring.value)


ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")


def _code(m: re.Match[str]) -> str:
    """A role's target as code: ``~`` keeps its last name, as Sphinx shows it."""
    tilde, target = m.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"
