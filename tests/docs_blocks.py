"""The code blocks of README.md and docs/*.md, read as the docs test runs them.

Every fenced block carries a language:
- ``python`` blocks run, in page order, in one namespace per page;
- ``bash`` blocks run with ``bash -euo pipefail`` in the page's working folder;
- ``console`` blocks are a session: each ``$ `` line runs as a bash command, the rest is the
  output it printed on some machine (not compared: figures differ);
- ``text`` blocks (output, synopses, layouts), ``yaml`` and ``json`` blocks are not run.

A hidden ``<!-- docs-test ... -->`` comment holds Python that runs in its place (the files and
names a page's examples assume: a photo folder, a model). ``<!-- not run: REASON -->`` right before a
block leaves it out, and the reason is reported. ``<!-- needs: lightning, accelerate -->`` right
before a block runs it only where those modules import (optional extras; the skip is reported).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ("python", "bash", "console")
LANGUAGES = (*RUN, "text", "yaml", "json")
_FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)\s*$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.+?)\s*-->\s*$")
_NEEDS = re.compile(r"^\s*<!--\s*needs:\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One block of a page: its language, code, first line (1-based), why it is not run, and
    the modules it needs."""

    page: str
    line: int
    language: str
    code: str
    hidden: bool = False
    not_run: str | None = None
    needs: tuple[str, ...] = ()

    @property
    def script(self) -> str:
        """What runs: the code, or a console block's ``$`` commands."""
        if self.language != "console":
            return self.code
        return "\n".join(ln[2:] for ln in self.code.splitlines() if ln.startswith("$ "))


def pages() -> list[Path]:
    """README.md and every page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The page's blocks in order; an untagged fence has language ``""``."""
    name = page.relative_to(ROOT).as_posix()
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i, pending_reason, pending_needs = 0, None, ()
    while i < len(lines):
        line = lines[i]
        if line.strip() == "<!-- docs-test":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "-->")
            out.append(Block(name, i + 2, "python", "\n".join(lines[i + 1:end]), hidden=True))
            i = end + 1
            continue
        if m := _NOT_RUN.match(line):
            pending_reason = m.group(1)
            i += 1
            continue
        if m := _NEEDS.match(line):
            pending_needs = tuple(n.strip() for n in m.group(1).split(","))
            i += 1
            continue
        if m := _FENCE.match(line):
            indent, fence, language = m.groups()
            end = next((j for j in range(i + 1, len(lines))
                        if lines[j].strip() == fence), None)
            if end is None:
                raise ValueError(f"{name}:{i + 1}: a code block that never closes")
            code = "\n".join(ln[len(indent):] for ln in lines[i + 1:end])
            out.append(Block(name, i + 2, language, code, not_run=pending_reason,
                             needs=pending_needs))
            i, pending_reason, pending_needs = end + 1, None, ()
            continue
        if line.strip():
            pending_reason, pending_needs = None, ()
        i += 1
    return out
