"""Typed manifest columns: a CSV/JSONL manifest's keypoints, boxes, text and array columns become
fields of their own (which the loader transforms with the image) instead of the ``meta`` JSON
passthrough (:class:`LabelColumns`). Columns left in ``meta`` whose names look geometric get a
warning."""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from feedpipe.errors import BadInputError, ConfigError
from feedpipe.schema.fields import ArrayField, Field
from feedpipe.schema.geometric import BoxesField, KeypointsField, TextField

from .sources import Source, SourceItem, open_regular, outside
from .swap import shown

GEOMETRIC_NAMES = frozenset({"keypoints", "landmarks", "points", "bbox", "bboxes", "box", "boxes",
                             "x", "y", "x1", "y1", "x2", "y2", "polygon", "segmentation"})


@dataclass(frozen=True)
class LabelColumns:
    """``convert(..., columns=LabelColumns(...))``: which manifest columns hold typed labels
    (``--keypoints-column`` and the like; docs/fields.md). Values are JSON (a CSV cell holds
    JSON text); coordinates are pixels of the stored image.

    Args:
        keypoints: A column of ``[[x, y(, v)], ...]`` (the same K in every row).
        boxes: A column of ``[[x1, y1, x2, y2, label], ...]``.
        text: A column of text (CTC-ready when ``vocab`` is given).
        arrays: Columns of ``.npy`` paths (relative to the manifest; read without pickle) or
            JSON lists.
        flip_indices: For each landmark, the one it becomes under a horizontal flip.
        vocab: The text's characters: character ``c`` is stored as ``vocab.index(c) + 1`` (0 is
            CTC's blank and the padding).
        classes: The box categories' names (box labels are indices into them).
    """

    keypoints: str | None = None
    boxes: str | None = None
    text: str | None = None
    arrays: tuple[str, ...] = ()
    flip_indices: tuple[int, ...] | None = None
    vocab: str | None = None
    classes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        flip = self.flip_indices
        if flip is not None:
            k = len(flip)
            if sorted(flip) != list(range(k)) or any(flip[flip[i]] != i for i in range(k)):
                raise ConfigError(f"flip_indices={','.join(map(str, flip))!r}: not a self-inverse "
                                  f"permutation of 0..{k - 1} (each landmark names its mirror, "
                                  "pairs swap both ways, e.g. 1,0,2)", option="flip_indices")
        if self.vocab is not None:
            twice = sorted({c for c in self.vocab if self.vocab.count(c) > 1})
            if twice or not self.vocab or "\0" in self.vocab:
                raise ConfigError(f"vocab={self.vocab!r}: the characters must be distinct and "
                                  "not NUL (each one's position is its CTC index)"
                                  + (f"; repeated: {''.join(twice)!r}" if twice else ""),
                                  option="vocab")

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
    about geometric-looking columns left in ``meta`` (passed through in stored-image pixels).
    A row whose cell is malformed (not JSON, the wrong shape, a character outside the vocab) is
    refused by its line, not fatal (``convert(strict=True)`` stops on it)."""
    cols = cols or LabelColumns()
    names = cols.names
    if names and source.kind != "manifest":
        raise ConfigError(f"label columns {names} come from a CSV/JSONL manifest; {source.root} "
                          f"is a {source.kind} source")
    if not names:
        return _warn_geometric(source)
    bad: dict[int, str] = {}  # item index -> why its row is refused
    values: dict[str, list[Any]] = {n: [] for n in names}
    for k, it in enumerate(source.items):
        extra = it.extra or {}
        for n in names:
            raw = extra.get(n)
            if n not in extra:
                bad.setdefault(k, f"no column {n!r}")
            path = n in cols.arrays and isinstance(raw, str) and raw.strip().endswith(".npy")
            try:
                values[n].append(raw if n == cols.text or path else _json(raw, f"column {n!r}"))
            except BadInputError as exc:
                bad.setdefault(k, str(exc))
                values[n].append(None)
    fields: list[Field] = []
    if cols.keypoints:
        values[cols.keypoints] = _keypoints(values[cols.keypoints], cols.keypoints, bad)
        shapes = Counter(a.shape for k, a in enumerate(values[cols.keypoints]) if k not in bad)
        if shapes:
            shape = shapes.most_common(1)[0][0]
            for k, a in enumerate(values[cols.keypoints]):
                if k not in bad and a.shape != shape:
                    bad[k] = (f"column {cols.keypoints!r}: {a.shape[0]} points, where the other "
                              f"rows have {shape[0]} (every row needs the same K)")
            if cols.flip_indices is not None and len(cols.flip_indices) != shape[0]:
                raise ConfigError(f"flip_indices={','.join(map(str, cols.flip_indices))!r}: "
                                  f"{len(cols.flip_indices)} entries for {shape[0]} keypoints",
                                  option="flip_indices")
            fields.append(KeypointsField(cols.keypoints, shape=shape,
                                         flip_indices=cols.flip_indices))
    if cols.boxes:
        values[cols.boxes] = [_boxes(v, cols.boxes, k, bad) for k, v in
                              enumerate(values[cols.boxes])]
        fields.append(BoxesField(cols.boxes, classes=cols.classes))
    if cols.text:
        fields.append(TextField(cols.text, vocab=cols.vocab))
    for n in cols.arrays:
        arrs = [_array(v, source, n, k, bad) for k, v in enumerate(values[n])]
        good = [a for k, a in enumerate(arrs) if k not in bad]
        fields.append(ArrayField(n, good[0].dtype.str if good else "float32", _shape(good)))
        values[n] = arrs
    for f in fields:  # the field's own checks (vocab, finite xyxy boxes...), row by row
        for k, v in enumerate(values[f.name]):
            if k not in bad:
                try:
                    f.validate(v)
                except (TypeError, ValueError) as exc:
                    bad[k] = str(exc)
    items, refused = [], list(source.refused)
    for k, it in enumerate(source.items):
        if k in bad:
            refused.append((it.rel, f"manifest line {it.row}: {bad[k]}"))
            continue
        items.append(replace(it, extra={c: v for c, v in (it.extra or {}).items()
                                        if c not in names} or None,
                             fields={**(it.fields or {}), **{n: values[n][k] for n in names}}))
    if not items:
        raise BadInputError(f"{source.root}: every manifest row was refused; "
                            + "; ".join(f"{p}: {r}" for p, r in refused[:3]))
    return _warn_geometric(replace(source, items=tuple(items), typed=(*source.typed, *fields),
                                   refused=tuple(refused)))


def _warn_geometric(source: Source) -> Source:
    left = sorted({k for it in source.items for k in (it.extra or {})
                   if k.lower() in GEOMETRIC_NAMES})
    if left:
        warnings.warn(f"{source.root}: manifest columns {left} go to the 'meta' JSON field "
                      "unchanged, in stored-image pixels: the loader's crop, resize and flip do "
                      "not apply to them; declare them (--keypoints-column, --boxes-column) to "
                      "have them follow the image", stacklevel=3)
    return source


class KeypointCheck:
    """Keypoints that do not look like pixels of their image, gathered while converting and
    warned about, by file, at the end: every point in [0, 1] (normalized coordinates), or most of
    a sample's points outside its image (x and y swapped, another image size). Points with a
    stored visibility of 0 do not count (COCO writes them as 0, 0). Per sample only references
    are kept; the check runs once, vectorized, in :meth:`warn`."""

    CHUNK = 1 << 16  # samples judged at once (bounded memory)

    def __init__(self, fields: Sequence[Field]) -> None:
        self.fields = [f for f in fields if isinstance(f, KeypointsField)]
        self.rels: list[str] = []
        self.sizes: list[tuple[int, int]] = []
        self.points: dict[str, list[np.ndarray]] = {f.name: [] for f in self.fields}

    def add(self, rel: str, values: dict[str, Any], size: tuple[int, int]) -> None:
        """One converted sample: its typed values and its image's upright (W, H)."""
        self.rels.append(rel)
        self.sizes.append(size)
        for f in self.fields:
            self.points[f.name].append(values[f.name])

    def warn(self, where: str) -> list[str]:
        """Warn (a UserWarning per finding) and return the messages."""
        said = []
        n = len(self.rels)
        wh = np.asarray(self.sizes, np.float64).reshape(n, 1, 2)
        for f in self.fields:
            if not n:
                break
            parts = [self._judge(f, np.stack(self.points[f.name][k: k + self.CHUNK]),
                                 wh[k: k + self.CHUNK]) for k in range(0, n, self.CHUNK)]
            unit, out, count = (np.concatenate(a) for a in zip(*parts, strict=True))
            far = 2 * out > count
            if unit.any():
                rels = [r for r, u in zip(self.rels, unit, strict=True) if u]
                said.append(f"{where}: keypoints {f.name!r} of {len(rels)} of {n} samples all "
                            f"lie in [0, 1] ({shown(rels)}): normalized coordinates? They "
                            "are read as pixels of the image as decoded: multiply x by its "
                            "width and y by its height")
            if far.any():
                rels = [f"{r} ({w}x{h}: {o} of {c})" for r, (w, h), o, c, x
                        in zip(self.rels, self.sizes, out, count, far, strict=True) if x]
                said.append(f"{where}: keypoints {f.name!r}: most points of {len(rels)} of {n} "
                            f"samples lie outside their image ({shown(rels)} outside): x "
                            "and y swapped, or coordinates of another image size? They are "
                            "pixels of the image as decoded (EXIF orientation applied)")
        for text in said:
            warnings.warn(text, stacklevel=2)
        return said

    @staticmethod
    def _judge(f: KeypointsField, p: np.ndarray, wh: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per sample (``p``: N×K×2|3 points, ``wh``: N×1×2 image sizes): whether every judged
        point lies in [0, 1], how many lie outside the image, how many are judged."""
        xy = p[..., :2]
        judged = np.isfinite(xy).all(-1) & ((p[..., 2] > 0) if f.has_visibility else True)
        count = judged.sum(1)
        beyond = (judged[..., None] & ((xy < 0) | (xy > 1))).any((1, 2))
        top = np.where(judged[..., None], xy, 0).max((1, 2))
        unit = (count > 0) & ~beyond & (top > 0) & (wh.max((1, 2)) > 2)
        out = (judged & ((xy < 0) | (xy > wh)).any(-1)).sum(1)
        return unit, out, count


def _keypoints(cells: list[Any], name: str, bad: dict[int, str]) -> list[np.ndarray]:
    out = []
    for k, v in enumerate(cells):
        try:
            a = np.asarray(v, np.float32)
        except (TypeError, ValueError):
            a = np.zeros((0,), np.float32)
        if k not in bad and (a.ndim != 2 or a.shape[1] not in (2, 3) or not len(a)):
            bad[k] = f"column {name!r}: keypoints are [[x, y], ...] or [[x, y, v], ...], got {v!r:.60}"
        out.append(a)
    return out


def _boxes(v: Any, name: str, k: int, bad: dict[int, str]) -> dict[str, np.ndarray]:
    try:
        r = np.asarray(v if v is not None else [], np.float64)
        if r.size and (r.ndim != 2 or r.shape[1] != 5):
            raise ValueError
        r = r.reshape(-1, 5)
    except (TypeError, ValueError):
        bad.setdefault(k, f"column {name!r}: boxes are [[x1, y1, x2, y2, label], ...], got "
                          f"{v!r:.60}")
        r = np.zeros((0, 5))
    return {"boxes": r[:, :4], "labels": r[:, 4].astype(np.int64)}


def _array(value: Any, source: Source, name: str, k: int, bad: dict[int, str]) -> np.ndarray:
    """A ``.npy`` path (read without pickle) or a JSON list as a numeric array; a bad one refuses
    row ``k``."""
    what = f"column {name!r}"
    try:
        if isinstance(value, str):
            path = source.root / value
            why = outside(source.root, value) if source.contained else None
            if why is not None:
                raise BadInputError(f"{what}: {value}: {why}")
            try:
                with os.fdopen(open_regular(path)[0], "rb") as fh:  # never a FIFO or a device
                    arr = np.load(fh, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise BadInputError(f"{path}: {what}: cannot read a .npy without pickle: "
                                    f"{exc}") from exc
        else:
            arr = np.asarray(value)
        if arr.dtype.hasobject or arr.dtype.kind not in "biuf":
            raise BadInputError(f"{what}: arrays must be numeric, got {arr.dtype}")
    except (BadInputError, TypeError, ValueError) as exc:
        bad.setdefault(k, str(exc))
        return np.zeros(0)
    return arr


def _shape(arrs: list[np.ndarray]) -> tuple[int | None, ...] | None:
    """The schema shape: fixed where every array agrees, None where they differ."""
    ranks = {a.ndim for a in arrs}
    if len(ranks) != 1:
        return None
    return tuple(d if all(a.shape[i] == d for a in arrs) else None
                 for i, d in enumerate(arrs[0].shape))


__all__ = ["GEOMETRIC_NAMES", "KeypointCheck", "LabelColumns", "SourceItem", "apply_columns"]
