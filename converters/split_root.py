"""A split root: ``data/train``, ``data/val`` (and ``data/test``), each an ImageFolder tree, written
as one dataset per split (``"separate"``) or one with a ``split`` field (``"field"``); the class
lists must agree unless ``split_classes="union"``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

from feedpipe.errors import ConfigError

from .sources import SPLIT_NAMES, Source, scan, split_dirs

SplitRoot = Literal["separate", "field"]
SplitClasses = Literal["agree", "union"]


def scan_split_root(src: str | Path, mode: SplitRoot, classes: SplitClasses = "agree",
                    contained: bool = False) -> Source:
    """Scan each split as an ImageFolder tree and merge them; ``contained`` as for ``scan``."""
    src = Path(src)
    names = split_dirs(src)
    if not names:
        raise ConfigError(f"split_root={mode!r}: {src} is not a split root (its top level must "
                          f"be only 2 or 3 of {', '.join(SPLIT_NAMES)}, each with class folders)",
                          option="split_root")
    parts = {n: scan(src / n, "imagefolder", contained=contained) for n in names}
    lists = {n: set(s.classes) for n, s in parts.items()}
    union = sorted(set().union(*lists.values()))
    if classes == "agree":
        diff = [f"{n} lacks {', '.join(sorted(set(union) - c))}" for n, c in lists.items()
                if set(union) - c]
        if diff:
            raise ConfigError(f"{src}: the splits' class lists differ ({'; '.join(diff)}); "
                              "labels would not mean the same class across splits. Add the "
                              "missing class folders, or pass split_classes='union' "
                              "(--split-classes union)")
    label = {c: k for k, c in enumerate(union)}
    items, ignored, refused = [], [], []
    for n, s in parts.items():
        for it in s.items:
            items.append(replace(it, rel=f"{n}/{it.rel}", label=label[s.classes[it.label]]))
        ignored += [(f"{n}/{p}", r) for p, r in s.ignored]
        refused += [(f"{n}/{p}", r) for p, r in s.refused]
    return Source(src, "splitroot", tuple(items), tuple(union), tuple(ignored),
                  refused=tuple(refused), split_by=mode, split_names=tuple(names),
                  contained=contained)


def split_of(rel: str) -> str:
    """The split an item of a split root belongs to (its first path component)."""
    return rel.partition("/")[0]
