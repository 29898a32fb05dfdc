"""Sources whose samples arrive as bytes in memory (foreign shards, Hugging Face datasets, arrays),
packed by :func:`converters.convert` like image files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from feedpipe.schema.fields import Field


@dataclass
class Record:
    """One sample from an in-memory source: a display name (``shard.tar/key``), the encoded image,
    the label (-1: none), other values by field name, and why it cannot be stored, if so."""

    name: str
    image: bytes | None = None
    label: int = -1
    values: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None


@dataclass(frozen=True)
class RecordSource:
    """What a record source knows before packing: its roots (the output stays out of them), fields,
    classes, what was not taken, and how to (re)iterate."""

    roots: tuple[Path, ...]
    kind: str
    fields: tuple[Field, ...]
    classes: tuple[str, ...]
    labeled: bool
    count: int
    records: Callable[[], Iterator[Record]]
    not_taken: tuple[dict[str, str], ...] = ()
    conversion: dict[str, Any] = field(default_factory=dict)
    images: bool = True  # False: samples are ``values`` only (arrays), stored as given


def field_name(suffix: str, taken: Sequence[str]) -> str:
    """A field name (an identifier) for a member suffix or column name: ``seg.png`` →
    ``seg_png``; one already ``taken`` gets ``_2``, ``_3``..."""
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in suffix) or "field"
    if name[0].isdigit():
        name = "f_" + name
    if name in ("image", "label", "path"):
        name += "_"
    base, n = name, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name
