"""Typed manifest columns: a CSV/JSONL manifest's keypoints, boxes, text and array columns become
fields of their own (which the loader transforms with the image) instead of the ``meta`` JSON
passthrough. Columns left in ``meta`` whose names look geometric get a warning.

Values: JSON (a CSV cell holds JSON text) — keypoints ``[[x, y], ...]`` or ``[[x, y, v], ...]``;
boxes ``[[x1, y1, x2, y2, label], ...]`` (xyxy pixels of the stored image); text a string; an
array a path to a ``.npy`` file (relative to the manifest; read without pickle) or a JSON list.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from feedpipe.errors import BadInputError, ConfigError
from feedpipe.schema.fields import ArrayField, Field
from feedpipe.schema.geometric import BoxesField, KeypointsField, TextField

from .sources import Source, SourceItem

GEOMETRIC_NAMES = frozenset({"keypoints", "landmarks", "points", "bbox", "bboxes", "box", "boxes",
                             "x", "y", "x1", "y1", "x2", "y2", "polygon", "segmentation"})


@dataclass(frozen=True)
class LabelColumns:
    """Which manifest columns hold typed labels (``--keypoints-column`` and the like)."""

    keypoints: str | None = None
    boxes: str | None = None
    text: str | None = None
    arrays: tuple[str, ...] = ()
    flip_indices: tuple[int, ...] | None = None
    vocab: str | None = None
    classes: tuple[str, ...] | None = None  # box category names (labels are indices into them)

    @property
    def names(self) -> list[str]:
        return [n for n in (self.keypoints, self.boxes, self.text, *self.arrays) if n]


def _json(value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else None
        except ValueError as exc:
            raise BadInputError(f"{what}: not JSON: {exc}") from exc
    return value


def apply_columns(source: Source, cols: LabelColumns | None) -> Source:
    """Move the declared columns of a manifest source out of ``extra`` into typed fields; warn
    about geometric-looking columns left in ``meta`` (passed through in stored-image pixels)."""
    cols = cols or LabelColumns()
    names = cols.names
    if names and source.kind != "manifest":
        raise ConfigError(f"label columns {names} come from a CSV/JSONL manifest; {source.root} "
                          f"is a {source.kind} source")
    values: dict[str, list[Any]] = {n: [] for n in names}
    for k, it in enumerate(source.items):
        extra = it.extra or {}
        for n in names:
            if n not in extra:
                raise BadInputError(f"{it.rel}: manifest row {k + 1} has no column {n!r}")
            what = f"{it.rel}: column {n!r}"
            raw = extra[n]
            path = n in cols.arrays and isinstance(raw, str) and raw.strip().endswith(".npy")
            values[n].append(raw if n == cols.text or path else _json(raw, what))
    fields: list[Field] = []
    if cols.keypoints:
        arrs = [np.asarray(v, np.float32) for v in values[cols.keypoints]]
        shapes = {a.shape for a in arrs}
        if len(shapes) != 1:
            raise BadInputError(f"column {cols.keypoints!r}: every row needs the same K×2 or "
                                f"K×3 points; found shapes {sorted(shapes)[:4]}")
        fields.append(KeypointsField(cols.keypoints, shape=shapes.pop(),
                                     flip_indices=cols.flip_indices))
        values[cols.keypoints] = arrs
    if cols.boxes:
        rows = [np.asarray(v if v is not None else [], np.float64).reshape(-1, 5)
                for v in values[cols.boxes]]
        values[cols.boxes] = [{"boxes": r[:, :4], "labels": r[:, 4].astype(np.int64)}
                              for r in rows]
        fields.append(BoxesField(cols.boxes, classes=cols.classes))
    if cols.text:
        fields.append(TextField(cols.text, vocab=cols.vocab))
    for n in cols.arrays:
        arrs = [_array(v, source, f"column {n!r}") for v in values[n]]
        fields.append(ArrayField(n, arrs[0].dtype.str if arrs else "float32", _shape(arrs)))
        values[n] = arrs
    items = tuple(replace(it, extra={k: v for k, v in (it.extra or {}).items() if k not in names}
                          or None, fields={**(it.fields or {}), **{n: values[n][k]
                                                                   for n in names}} or None)
                  for k, it in enumerate(source.items))
    out = replace(source, items=items, typed=(*source.typed, *fields))
    left = sorted({k for it in items for k in (it.extra or {}) if k.lower() in GEOMETRIC_NAMES})
    if left:
        warnings.warn(f"{source.root}: manifest columns {left} go to the 'meta' JSON field "
                      "unchanged, in stored-image pixels: the loader's crop, resize and flip do "
                      "not apply to them; declare them (--keypoints-column, --boxes-column) to "
                      "have them follow the image", stacklevel=2)
    return out


def _array(value: Any, source: Source, what: str) -> np.ndarray:
    if isinstance(value, str):
        path = source.root / value
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise BadInputError(f"{path}: {what}: cannot read a .npy without pickle: {exc}") from exc
    else:
        arr = np.asarray(value)
    if arr.dtype.hasobject or arr.dtype.kind not in "biuf":
        raise BadInputError(f"{what}: arrays must be numeric, got {arr.dtype}")
    return arr


def _shape(arrs: list[np.ndarray]) -> tuple[int | None, ...] | None:
    """The schema shape: fixed where every array agrees, None where they differ."""
    ranks = {a.ndim for a in arrs}
    if len(ranks) != 1:
        return None
    return tuple(d if all(a.shape[i] == d for a in arrs) else None
                 for i, d in enumerate(arrs[0].shape))


__all__ = ["GEOMETRIC_NAMES", "LabelColumns", "SourceItem", "apply_columns"]
