"""pyproject.toml's dependency lists say what they hold: no requirement hidden in a comment (a
package written after a ``#`` on a list line is silently not installed, and the tests that need it
skip)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
REQUIREMENT_IN_COMMENT = re.compile(r'#.*"[A-Za-z0-9_.\-]+(\[[\w,\-]+\])?\s*(>=|==|<=|~=|<|>)')


def test_no_requirement_in_a_comment() -> None:
    hidden = [f"pyproject.toml:{n}: {line.strip()}"
              for n, line in enumerate(PYPROJECT.read_text().splitlines(), 1)
              if REQUIREMENT_IN_COMMENT.search(line)]
    assert not hidden, hidden


def test_the_test_extra_holds_what_the_suite_imports() -> None:
    test = [r for r in metadata.requires("feedpipe") or [] if 'extra == "test"' in r]
    names = {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in test}
    for needed in ("webdataset", "scikit-image", "psutil", "pyarrow", "moto", "grimp"):
        assert needed in names, needed
