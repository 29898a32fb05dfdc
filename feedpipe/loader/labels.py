"""Labels that follow the image (keypoints, boxes) and ragged values (text, variable-shape arrays):
a :class:`Collector` copies each sample's value with its geometry, then transforms and pads the
whole batch at once. Pixel ``i`` covers ``[i, i+1)``: box (top, left, h, w) resized to oh×ow maps
``x → (x - left) * ow / w``, then a flip ``x → ow - x``, then the affine's matrix; a point is
inside when ``0 <= x <= ow`` and ``0 <= y <= oh``, before and after the affine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError, CorruptRecordError
from ..schema.fields import ArrayField, Field
from ..schema.geometric import BoxesField, KeypointsField, TextField
from .config import Ragged
from .geometry import Geometry

PAD_LABEL = -1  # padding of box labels and attributes (counts say how many rows are real)
# top, left, height, width, flip, out height, out width, then the affine's a, b, c, d, e, f
_IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
_UNKNOWN = (0.0, 0.0, 1.0, 1.0, 0.0, np.inf, np.inf, *_IDENTITY)  # no image: identity, no clip


@dataclass(frozen=True)
class RaggedList:
    """Every sample's rows packed flat with a count per sample (two tensors across processes)."""

    values: torch.Tensor
    counts: torch.Tensor

    def split(self, device: torch.device) -> list[torch.Tensor]:
        v = self.values.to(device, non_blocking=True)
        return list(v.split(self.counts.tolist()))


@dataclass
class Moved:
    """A collected field's values on the output canvas, per sample, before batching."""

    values: Any  # keypoints: N×K×2 float32; boxes: one M×4 float32 xyxy array per sample
    visible: np.ndarray | None = None  # keypoints: N×K
    ints: list[np.ndarray] | None = None  # boxes: per sample, M×(1 + attrs) int64 rows


def collects(f: Field, ragged: Ragged) -> bool:
    """Whether ``f`` is gathered by a :class:`Collector` rather than stacked or listed as is."""
    return isinstance(f, (KeypointsField, BoxesField, TextField)) or (
        isinstance(f, ArrayField) and not f.fixed and ragged == "pad")


def batch_keys(f: Field, ragged: Ragged) -> list[str]:
    """The keys a collected field adds to a batch (its own name first)."""
    n = f.name
    if isinstance(f, KeypointsField):
        return [n, f"{n}_visible"]
    if isinstance(f, BoxesField):
        return [n, f"{n}_labels", *(f"{n}_{a}" for a in f.attrs), f"{n}_count"]
    return [n, f"{n}_lengths"]


def check_keys(fields: list[Field], ragged: Ragged) -> None:
    """Refuse a request where a collected field's extra keys collide with another field's name."""
    names = {f.name for f in fields}
    for f in fields:
        if collects(f, ragged):
            clash = sorted(set(batch_keys(f, ragged)[1:]) & names)
            if clash:
                raise ConfigError(f"field {f.name!r} adds batch keys {clash} that are also field "
                                  "names; load one of them, or rename it at conversion")


def geometry_row(geo: Geometry | None, size: tuple[int, int] | None) -> tuple[float, ...]:
    """The sample's geometry as one row: box, flip, output size, affine matrix."""
    if geo is None:
        return _UNKNOWN
    oh, ow = size if size is not None else (geo.height, geo.width)
    return (geo.top, geo.left, geo.height, geo.width, float(geo.flip), oh, ow,
            *(geo.affine or _IDENTITY))


def _affine(x: np.ndarray, y: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points through each sample's affine; rows without one keep theirs (NaN-safe)."""
    moved = (g[..., 7:] != _IDENTITY).any(-1)
    if not moved.any():
        return x, y
    with np.errstate(invalid="ignore"):
        return (np.where(moved, g[..., 7] * x + g[..., 8] * y + g[..., 9], x),
                np.where(moved, g[..., 10] * x + g[..., 11] * y + g[..., 12], y))


def _inside(x: np.ndarray, y: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Points on the output canvas (edges included; ``g``: geometry rows, broadcast)."""
    return (x >= 0) & (x <= g[..., 6]) & (y >= 0) & (y <= g[..., 5])


def _map(v: np.ndarray, g: np.ndarray, axis: int) -> np.ndarray:
    """x (``axis`` 1) or y (0) in source pixels → output pixels, before any flip."""
    return (v - g[..., axis]) * (np.where(np.isinf(g[..., 5 + axis]), 1.0,
                                          g[..., 5 + axis] / g[..., 2 + axis]))


class Collector:
    """Gathers one field's values for one batch of ``n`` samples; see the module docstring."""

    def __init__(self, field: Field, n: int, size: tuple[int, int] | None, ragged: Ragged,
                 min_box_fraction: float) -> None:
        self.field, self.n, self.size = field, n, size
        self.ragged, self.min_box_fraction = ragged, min_box_fraction
        self.geo = np.tile(np.asarray(_UNKNOWN), (n, 1))
        self.rows: list[Any] = [None] * n
        if isinstance(field, KeypointsField):
            self.points = np.zeros((n, *field.shape), np.float32)  # type: ignore[misc]

    def put(self, pos: int, stored: Any, geo: Geometry | None, what: str) -> None:
        """Copy sample ``pos``'s stored value out of the read buffer, with its geometry."""
        f = self.field
        self.geo[pos] = geometry_row(geo, self.size)
        if isinstance(f, KeypointsField):
            self.points[pos] = stored
        elif isinstance(f, BoxesField):
            boxes, ints = f.parse(stored, what)
            self.rows[pos] = (boxes.copy(), ints.copy())
        elif isinstance(f, TextField):
            text = f.text(stored, what)
            self.rows[pos] = np.frombuffer(text.encode("utf-32-le"), "<u4").astype(np.int64)
        else:
            self.rows[pos] = np.array(stored)

    @property
    def geometric(self) -> bool:
        """Whether the values follow the image (keypoints, boxes)."""
        return isinstance(self.field, (KeypointsField, BoxesField))

    def moved(self) -> Moved:
        """Keypoints or boxes on the output canvas, per sample, for a ``transform=`` to change."""
        f = self.field
        if isinstance(f, KeypointsField):
            points, visible = self._keypoints_moved(f)
            return Moved(points, visible=visible)
        assert isinstance(f, BoxesField)
        boxes, ints, counts = self._boxes_moved(f)
        at = np.cumsum(counts)[:-1]
        return Moved(np.split(boxes, at), ints=np.split(ints, at))

    def finish(self, moved: Moved | None = None) -> dict[str, Any]:
        """The batch's keys of this field (from ``moved``: as a transform left them)."""
        f = self.field
        if isinstance(f, KeypointsField):
            m = moved or self.moved()
            return {f.name: torch.from_numpy(m.values),
                    f"{f.name}_visible": torch.from_numpy(m.visible)}
        if isinstance(f, BoxesField):
            if moved is None:
                return self._boxes(f, *self._boxes_moved(f))
            counts = np.fromiter((len(b) for b in moved.values), np.int64, self.n)
            width = 1 + len(f.attrs)
            return self._boxes(f, np.concatenate([np.zeros((0, 4), np.float32), *moved.values]),
                               np.concatenate([np.zeros((0, width), np.int64),
                                               *(moved.ints or ())]),
                               counts)
        if isinstance(f, TextField):
            return self._text(f)
        return self._arrays(f)  # type: ignore[arg-type]

    def _keypoints_moved(self, f: KeypointsField) -> tuple[np.ndarray, np.ndarray]:
        """N×K×2 float32 points on the output canvas and N×K visibility."""
        g = self.geo[:, None, :]
        p = self.points.astype(np.float64)
        x, y = _map(p[..., 0], g, 1), _map(p[..., 1], g, 0)
        flip = self.geo[:, 4] > 0
        x = np.where(flip[:, None], self.geo[:, None, 6] - x, x)
        # in the crop, then in the output: a point the crop left out stays out (there is fill)
        visible = _inside(x, y, g)
        x, y = _affine(x, y, g)
        visible &= _inside(x, y, g)
        if f.has_visibility:
            visible &= p[..., 2] > 0
        out = np.stack([x, y], axis=-1).astype(np.float32)
        if f.flip_indices is not None and flip.any():
            perm = np.asarray(f.flip_indices)
            out[flip] = out[flip][:, perm]
            visible[flip] = visible[flip][:, perm]
        return out, visible

    def _boxes_moved(self, f: BoxesField) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The kept boxes on the canvas (M×4 xyxy), their (label, attrs) rows and counts."""
        width = 1 + len(f.attrs)
        rows = [r if r is not None else (np.zeros((0, 4), np.float32),
                                         np.zeros((0, width), np.int64)) for r in self.rows]
        counts = np.fromiter((len(r[0]) for r in rows), np.int64, self.n)
        boxes = np.concatenate([r[0] for r in rows]).astype(np.float64) if self.n \
            else np.zeros((0, 4))
        ints = np.concatenate([r[1] for r in rows]) if self.n else np.zeros((0, width), np.int64)
        sample = np.repeat(np.arange(self.n), counts)
        g = self.geo[sample]
        x1, x2 = _map(boxes[:, 0], g, 1), _map(boxes[:, 2], g, 1)
        y1, y2 = _map(boxes[:, 1], g, 0), _map(boxes[:, 3], g, 0)
        flip = g[:, 4] > 0
        x1, x2 = np.where(flip, g[:, 6] - x2, x1), np.where(flip, g[:, 6] - x1, x2)
        if (g[:, 7:] != _IDENTITY).any():  # the enclosing box of the four moved corners
            cx, cy = _affine(np.stack([x1, x2, x1, x2]), np.stack([y1, y1, y2, y2]), g)
            x1, x2, y1, y2 = cx.min(0), cx.max(0), cy.min(0), cy.max(0)
        area = (x2 - x1) * (y2 - y1)
        cx1, cx2 = np.clip(x1, 0, g[:, 6]), np.clip(x2, 0, g[:, 6])
        cy1, cy2 = np.clip(y1, 0, g[:, 5]), np.clip(y2, 0, g[:, 5])
        inside = (cx1 == x1) & (cx2 == x2) & (cy1 == y1) & (cy2 == y2)
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(area > 0, (cx2 - cx1) * (cy2 - cy1) / area, inside.astype(float))
        keep = (frac > 0) & (frac >= self.min_box_fraction)
        out = np.stack([cx1, cy1, cx2, cy2], axis=1)[keep].astype(np.float32)
        return out, ints[keep], np.bincount(sample[keep], minlength=self.n).astype(np.int64)

    def _boxes(self, f: BoxesField, out: np.ndarray, ints: np.ndarray,
               counts: np.ndarray) -> dict[str, Any]:
        """Boxes given sample after sample (``counts`` each) padded, or as lists."""
        keys = batch_keys(f, self.ragged)
        cols = [out, *(ints[:, j] for j in range(1 + len(f.attrs)))]
        if self.ragged == "list":
            t = torch.from_numpy(counts)
            res: dict[str, Any] = {k: RaggedList(torch.from_numpy(np.ascontiguousarray(c)), t)
                                   for k, c in zip(keys, cols, strict=False)}
        else:
            res = {k: torch.from_numpy(_pad_flat(c, counts, 0 if c is out else PAD_LABEL))
                   for k, c in zip(keys, cols, strict=False)}
        res[keys[-1]] = torch.from_numpy(counts)
        return res

    def _text(self, f: TextField) -> dict[str, Any]:
        rows = [r if r is not None else np.zeros(0, np.int64) for r in self.rows]
        lengths = np.fromiter((len(r) for r in rows), np.int64, self.n)
        codes = np.concatenate(rows) if self.n else np.zeros(0, np.int64)
        if f.vocab is not None:
            keys, idx = _vocab_table(f.vocab)
            at = np.minimum(np.searchsorted(keys, codes), len(keys) - 1)
            if len(codes) and not (keys[at] == codes).all():
                bad = "".join(sorted({chr(c) for c in codes[keys[at] != codes]}))
                raise CorruptRecordError(f"field {f.name!r}: characters {bad!r} are not in the "
                                         "schema's vocabulary")
            codes = idx[at]
        return {f.name: torch.from_numpy(_pad_flat(codes, lengths, 0)),
                f"{f.name}_lengths": torch.from_numpy(lengths)}

    def _arrays(self, f: ArrayField) -> dict[str, Any]:
        rows = self.rows
        ranks = {r.ndim for r in rows if r is not None}
        if len(ranks) > 1:
            raise ConfigError(f"field {f.name!r} holds arrays of ranks {sorted(ranks)}: they "
                              "cannot be padded into one batch; pass ragged='list'",
                              option="ragged")
        ndim = ranks.pop() if ranks else len(f.shape or ())
        shapes = np.array([r.shape if r is not None else (0,) * ndim for r in rows],
                          np.int64).reshape(self.n, ndim)
        top = shapes.max(axis=0) if self.n else np.zeros(ndim, np.int64)
        out = np.zeros((self.n, *top), np.dtype(f.dtype))
        for pos, r in enumerate(rows):  # one slice assignment per sample, into one buffer
            if r is not None:
                at: tuple[Any, ...] = (pos, *(slice(0, d) for d in r.shape))
                out[at] = r
        var = list(range(ndim)) if f.shape is None else \
            [i for i, s in enumerate(f.shape) if s is None]
        lengths = shapes[:, var[0]] if len(var) == 1 else shapes[:, var]
        return {f.name: torch.from_numpy(out), f"{f.name}_lengths": torch.from_numpy(lengths)}


def _pad_flat(flat: np.ndarray, lengths: np.ndarray, fill: int) -> np.ndarray:
    """Rows given flat with their lengths → an N×max(lengths)(×...) array padded with ``fill``."""
    n = len(lengths)
    out = np.full((n, int(lengths.max()) if n else 0, *flat.shape[1:]), fill, flat.dtype)
    sample = np.repeat(np.arange(n), lengths)
    out[sample, np.arange(len(flat)) - (np.cumsum(lengths) - lengths)[sample]] = flat
    return out


@functools.cache
def _vocab_table(vocab: str) -> tuple[np.ndarray, np.ndarray]:
    """(sorted code points, their 1-based vocabulary indices) for a searchsorted lookup."""
    cps = np.array([ord(c) for c in vocab], np.int64)
    order = np.argsort(cps)
    return cps[order], (order + 1).astype(np.int64)
