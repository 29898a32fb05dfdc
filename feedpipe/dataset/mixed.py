"""Several opened datasets (any format, local or remote) read as one: a concatenated index space
with a ``source`` field (int64, the source's position in the mix). Which samples an epoch reads
is the loader's business (``feedpipe.loader.mixing``); this reader maps indices, checks schemas.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np

from ..errors import ConfigError, FeedpipeError
from ..schema.fields import ArrayField, Field, ImageField
from ..schema.masks import MaskField, TargetField
from ..schema.model import Schema
from .formats.base import DatasetReader, ReaderOver, Visitor

SOURCE_FIELD = "source"
MixClasses = Literal["equal", "union"]
_SOURCE = ArrayField(SOURCE_FIELD, dtype="int64", shape=())


def _describe(f: Field) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in f.to_json().items() if k != "name")


def agree(name: str, fields: Sequence[Field], names: Sequence[str]) -> Field:
    """The one field that stands for ``fields`` (one per source) in the mix, or a ConfigError
    naming the field and the difference.

    Kinds must match. Images: encoded (JPEG/PNG/WebP, decoded per record) or raw, not both; the
    stored shape is kept only when every source has the same one. Masks, targets and arrays must
    match exactly (dtype, codec, shape, interpolation): they are resampled and batched as one.
    """
    first = fields[0]

    def refuse(detail: str, k: int) -> None:
        raise ConfigError(f"fields: {name!r} differs between the mixed datasets: {detail} in "
                          f"{names[0]!r} but {names[k]!r} has {_describe(fields[k])} (vs "
                          f"{_describe(first)})", option="fields")

    for k, f in enumerate(fields[1:], 1):
        if f.kind != first.kind:
            refuse(f"kind {first.kind!r}", k)
    if isinstance(first, ImageField):
        raw = [f.codec == "raw" for f in fields]  # type: ignore[attr-defined]
        if any(raw) and not all(raw):
            refuse(f"codec {first.codec!r} (raw arrays and encoded images do not mix)",
                   raw.index(not raw[0]))
        codecs = {f.codec for f in fields}  # type: ignore[attr-defined]
        shapes = {f.shape for f in fields}  # type: ignore[attr-defined]
        return replace(first, codec=first.codec if len(codecs) == 1 else "mixed",
                       shape=first.shape if len(shapes) == 1 else None)
    if isinstance(first, (MaskField, TargetField, ArrayField)):
        for k, f in enumerate(fields[1:], 1):
            if f != first:
                refuse(_describe(first), k)
    return first


class MixedReader(ReaderOver):
    """Read-only concatenation of ``sources`` (opened readers), with a ``source`` field.

    ``fields`` are the fields a loader will read (checked by :func:`agree`; None: every field all
    sources share and agree on). ``classes="equal"`` refuses sources whose ``label`` class lists
    differ; ``"union"`` remaps each source's labels into the union list (first source's classes
    first, then each new name in order).
    """

    format_name = "mixed"

    def __init__(self, sources: Sequence[DatasetReader], names: Sequence[str] | None = None, *,
                 fields: Sequence[str] | None = None, classes: MixClasses = "equal") -> None:
        if len(sources) < 1:
            raise ConfigError("a mix needs at least one dataset")
        self.sources = tuple(sources)
        short = [s.root.name for s in self.sources]  # each directory's name, unless two collide
        self.names = tuple(names) if names is not None else tuple(
            short if len(set(short)) == len(short) else (str(s.root) for s in self.sources))
        if len(self.names) != len(self.sources) or len(set(self.names)) != len(self.names):
            raise ConfigError(f"mix names {self.names!r}: give one distinct name per dataset")
        for name, src in zip(self.names, self.sources, strict=True):
            if SOURCE_FIELD in src.schema:
                raise ConfigError(f"dataset {name!r} ({src.root}) has its own {SOURCE_FIELD!r} "
                                  "field, which a mix adds; read it on its own")
            src.require_samples("a mix")
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes())]).astype(np.int64)
        common = [f.name for f in self.sources[0].schema
                  if all(f.name in s.schema for s in self.sources[1:])]
        wanted = [n for n in (fields or common) if n != SOURCE_FIELD]
        for n in wanted:
            for name, src in zip(self.names, self.sources, strict=True):
                if n not in src.schema:
                    raise ConfigError(f"fields: {n!r} is not in mixed dataset {name!r} "
                                      f"({src.root}); it has {src.schema.names}", option="fields")
        picked = []
        for n in wanted:
            try:
                picked.append(agree(n, [s.schema[n] for s in self.sources], self.names))
            except ConfigError:
                if fields:
                    raise  # asked for: the difference is named
        self.schema = Schema((*picked, _SOURCE))
        self.classes, self._remap = self._classes(classes, "label" in wanted)
        got = [s.decode_limits() for s in self.sources]  # each bound all recorded: the largest
        limits = {k: max(g[k] for g in got) for k in got[0] if all(k in g for g in got)}
        self.manifest = replace(self.sources[0].manifest, num_samples=int(self.offsets[-1]),
                                schema=self.schema, classes=self.classes, files=(), skipped=(),
                                extra={}, conversion=limits)
        self.root = Path("mix(" + " + ".join(f"{n}={s.root}" for n, s in
                                             zip(self.names, self.sources, strict=True)) + ")")

    def _classes(self, how: MixClasses, labeled: bool
                 ) -> tuple[tuple[str, ...], list[np.ndarray] | None]:
        lists = [s.classes for s in self.sources]
        if all(c == lists[0] for c in lists) or not labeled:
            return lists[0], None
        if how == "equal":
            k = next(i for i, c in enumerate(lists) if c != lists[0])
            only0 = [c for c in lists[0] if c not in lists[k]]
            onlyk = [c for c in lists[k] if c not in lists[0]]
            raise ConfigError(
                f"Mix(..., classes='equal'): 'label' class lists differ between "
                f"{self.names[0]!r} and {self.names[k]!r} (only in the first: {only0}, only in "
                f"the second: {onlyk}"
                f"{', same names in another order' if not only0 and not onlyk else ''}); pass "
                "Mix(..., classes='union') to remap labels into one list", option="mix_classes")
        if any(not c for c in lists):
            raise ConfigError("Mix(..., classes='union') needs every dataset's class list; "
                              f"{self.names[[bool(c) for c in lists].index(False)]!r} has none",
                              option="mix_classes")
        union: list[str] = []
        for c in lists:
            union += [n for n in c if n not in union]
        return tuple(union), [np.asarray([union.index(n) for n in c], np.int64) for c in lists]

    # -- index mapping ---------------------------------------------------------------------------
    def locate(self, index: int) -> tuple[int, int]:
        """(source, local index) of global ``index``."""
        s = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return s, int(index - self.offsets[s])

    def sizes(self) -> list[int]:
        return [len(s) for s in self.sources]

    # -- DatasetReader ---------------------------------------------------------------------------
    def _visit(self, indices: Sequence[int], fn: Visitor, fields: list[Field]) -> None:
        """One read pass per source over its share of ``indices``; ``fn`` gets each sample's
        batch position, so the grouping does not change the batch order."""
        idx = np.asarray(indices, np.int64)
        src = np.searchsorted(self.offsets, idx, side="right") - 1
        names = [f.name for f in fields if f.name != SOURCE_FIELD]
        for s in np.unique(src):
            positions = np.flatnonzero(src == s)
            local = idx[positions] - self.offsets[s]
            table = self._remap[s] if self._remap is not None and "label" in names else None

            def call(k: int, stored: dict[str, Any], s: int = int(s),
                     positions: np.ndarray = positions, table: Any = table) -> None:
                stored[SOURCE_FIELD] = s
                if table is not None:
                    stored["label"] = int(table[stored["label"]])
                fn(int(positions[k]), stored)

            self.sources[s].visit(local.tolist(), call, names)

    def located(self, exc: FeedpipeError) -> FeedpipeError:
        """``exc`` with its source file added by the dataset it names (once)."""
        for src in self.sources:
            if exc.dataset == src.root:
                return src.located(exc)
        return exc

    def describe(self, index: int) -> str:
        s, j = self.locate(index)
        return f"mix source {self.names[s]!r}: {self.sources[s].describe(j)}"

    def key_of(self, index: int) -> str:
        s, j = self.locate(index)
        return self.sources[s].key_of(j)

    def source_of(self, index: int) -> str | None:
        s, j = self.locate(index)
        return self.sources[s].source_of(j)

    def corrupt(self, index: int, detail: str, cause: BaseException | None = None) -> Any:
        s, j = self.locate(index)
        return self.sources[s].corrupt(j, f"(mix source {self.names[s]!r}) {detail}", cause)


__all__ = ["MixClasses", "MixedReader", "SOURCE_FIELD", "agree"]
