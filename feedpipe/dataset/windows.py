"""Windows cut at load time from a time series stored once: :class:`Windows`.

The columns used are read into memory once, at open (rows × columns × 4 bytes in float32);
window ``i`` is then two slices of them, so overlapping windows (``length / stride`` times the
series) are never stored. As a :class:`DatasetReader` it goes through ``make_loader`` like any
dataset: shuffled windows, equal batches per rank, exact resume.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Literal, Sequence

import numpy as np

from ..errors import ConfigError, DamagedDataError
from ..schema.fields import ArrayField, Field
from ..schema.model import Schema
from .formats.base import DatasetReader, ReaderOver, Visitor
from .registry import open_dataset

Gaps = Literal["refuse", "skip", "fill"]
Split = str | tuple[float, float] | tuple[int, int] | None
_READ = 8192  # rows read per visit of a row-per-sample dataset


class Windows(ReaderOver):
    """Fixed-length windows over a stored series, cut at load time (docs/arrays.md): window
    ``i`` is ``{"x": length × F, "y": horizon × T, "start": int64}``, ``x`` the feature columns
    of ``length`` rows from ``start``, ``y`` the target columns of the ``horizon`` rows after
    them. A ``DatasetReader``: pass it to ``make_loader`` (``fields=["x", "y"]``).

    Args:
        source: A series packed with ``series=True`` (``pack_arrays``, ``feedpipe convert
            TABLE --series``), or any dataset of fixed-shape numeric fields, one row per
            sample; a path or an opened dataset.
        length: Rows in each window's ``x``.
        targets: The fields forecast (``y``).
        horizon: Rows in each window's ``y``.
        stride: Rows between window starts.
        features: The fields read as input (``x``); None: every numeric field, targets
            included. A field holding a vector per row gives one column per element.
        split: The rows windows come from: None (all), "train"/"val" (before / from the
            conversion's ``train_fraction``), ``(a, b)`` floats (fractions of the rows) or ints
            (rows ``a .. b-1``). Every window lies wholly inside its split.
        normalize: Subtract each column's mean and divide by its std, both computed at
            conversion from the training rows only (a std of 0 divides by 1).
        gaps: Windows that touch a missing value (NaN, or an infinity): "refuse" (naming the
            rows), "skip" (left out, counted in ``left_out``), or "fill" (each column's last
            value before the gap; 0 before a column's first value, its mean when normalized).
        dtype: Of ``x`` and ``y`` (every column is cast to it once, at open).
    """

    format_name = "windows"

    def __init__(self, source: str | os.PathLike[str] | DatasetReader, *, length: int,
                 targets: Sequence[str], horizon: int = 1, stride: int = 1,
                 features: Sequence[str] | None = None, split: Split = None,
                 normalize: bool = False, gaps: Gaps = "refuse", dtype: str = "float32") -> None:
        for name, v in (("length", length), ("horizon", horizon), ("stride", stride)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"{name}={v!r}: a positive number of rows", option=name)
        if gaps not in ("refuse", "skip", "fill"):
            raise ConfigError(f"gaps={gaps!r}: use 'refuse', 'skip' or 'fill'", option="gaps")
        if np.dtype(dtype).kind != "f":
            raise ConfigError(f"dtype={dtype!r}: a float dtype", option="dtype")
        base = source if isinstance(source, DatasetReader) else open_dataset(source)
        self.base, self.sources = base, (base,)
        self.series: dict[str, Any] = base.manifest.conversion.get("series") or {}
        numeric = [f.name for f in base.schema if isinstance(f, ArrayField)
                   and np.dtype(f.dtype).kind in "biuf"]
        self.targets = _names(targets, numeric, base, "targets")
        self.features = _names(features if features is not None else numeric, numeric, base,
                               "features")
        if not self.targets:
            raise ConfigError("targets: name at least one field to forecast", option="targets")
        if not self.features:
            raise ConfigError(f"features: name at least one field to read as input, or leave "
                              f"it None for every numeric field ({numeric})", option="features")
        self.length, self.horizon, self.stride = int(length), int(horizon), int(stride)
        cols = _read_columns(base, list(dict.fromkeys([*self.features, *self.targets])),
                             self.series)
        rows = len(next(iter(cols.values())))
        self.rows = _rows(split, rows, self.series)
        x = np.concatenate([cols[n] for n in self.features], axis=1).astype(np.float64)
        y = np.concatenate([cols[n] for n in self.targets], axis=1).astype(np.float64)
        lo, hi = self.rows
        span = self.length + self.horizon
        starts = np.arange(lo, max(lo, hi - span + 1), self.stride, dtype=np.int64)
        self.left_out = 0  # windows left out for touching a gap (gaps="skip")
        xbad, ybad = (np.asarray(~np.isfinite(a).all(axis=1)) for a in (x, y))  # NaN or inf
        if (xbad | ybad)[lo:hi].any() and len(starts):
            if gaps == "refuse":
                raise ConfigError(_gap_message(base, cols, self.features, self.targets, lo, hi),
                                  option="gaps")
            if gaps == "skip":
                bad = _touches(xbad, starts, 0, self.length) | _touches(ybad, starts, self.length,
                                                                        span)
                self.left_out = int(bad.sum())
                starts = starts[~bad]
            else:
                x, y = _ffill(x), _ffill(y)
        if normalize:
            if not self.series.get("stats"):
                raise ConfigError(f"normalize=True: {base.root} holds no normalization "
                                  "statistics; pack it with series=True, train_fraction=F "
                                  "(--series --train-fraction F)", option="normalize")
            (xm, xs), (ym, ys) = self.stats().values()
            x, y = (x - xm) / np.where(xs == 0, 1.0, xs), (y - ym) / np.where(ys == 0, 1.0, ys)
        if gaps == "fill":
            x, y = np.nan_to_num(x, nan=0.0), np.nan_to_num(y, nan=0.0)
        if not len(starts):
            raise ConfigError(f"{base.root}: no window of {self.length}+{self.horizon} rows fits "
                              f"rows {lo}..{hi - 1}" + (f" ({self.left_out} touch a gap)" if
                                                        self.left_out else ""), option="split")
        self.x, self.y = np.ascontiguousarray(x, dtype), np.ascontiguousarray(y, dtype)
        self.starts = starts
        self._starts = starts.tolist()  # Python ints: the per-window loop indexes a list
        self.schema = Schema((ArrayField("x", dtype, (self.length, self.x.shape[1])),
                              ArrayField("y", dtype, (self.horizon, self.y.shape[1])),
                              ArrayField("start", "int64", ())))
        self.classes = ()
        params = {"length": self.length, "horizon": self.horizon, "stride": self.stride,
                  "features": self.features, "targets": self.targets, "rows": list(self.rows),
                  "normalize": normalize, "gaps": gaps, "left_out": self.left_out}
        self.manifest = replace(base.manifest, num_samples=len(starts), schema=self.schema,
                                classes=(), skipped=(),
                                conversion={**base.manifest.conversion, "windows": params})
        self.root = base.root

    def stats(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """(mean, std) per column of x and of y, as stored (to undo ``normalize`` on a
        prediction: ``y * std + mean``); from the training rows ``0 .. train_rows-1``."""
        stats = self.series.get("stats") or {}
        return {k: (np.concatenate([_stat(stats, n, "mean", self.base) for n in names]),
                    np.concatenate([_stat(stats, n, "std", self.base) for n in names]))
                for k, names in (("x", self.features), ("y", self.targets))}

    # -- DatasetReader ---------------------------------------------------------------------------
    def _visit(self, indices: Sequence[int], fn: Visitor, fields: list[Field]) -> None:
        names = {f.name for f in fields}
        want_x, want_y, want_start = "x" in names, "y" in names, "start" in names
        x, y, starts, n, span = self.x, self.y, self._starts, self.length, self.length + \
            self.horizon
        for pos, i in enumerate(indices):
            s = starts[i]
            stored: dict[str, Any] = {}
            if want_x:
                stored["x"] = x[s:s + n]
            if want_y:
                stored["y"] = y[s + n:s + span]
            if want_start:
                stored["start"] = np.int64(s)
            fn(pos, stored)

    def describe(self, index: int) -> str:
        s = self._starts[index] if 0 <= index < len(self._starts) else -1
        last = s + self.length + self.horizon - 1
        return f"{self.root} (windows) window {index} (rows {s}..{last})"


def _names(names: Sequence[str] | str, numeric: list[str], base: DatasetReader,
           option: str) -> list[str]:
    if isinstance(names, str):
        names = [names]
    for n in names:
        if n not in numeric:
            what = "not in the dataset" if n not in base.schema else "not a numeric array field"
            raise ConfigError(f"{option}: {n!r} is {what}; {base.root} has the numeric fields "
                              f"{numeric}", option=option)
    return list(dict.fromkeys(names))


def _read_columns(base: DatasetReader, names: list[str], series: dict[str, Any]
                  ) -> dict[str, np.ndarray]:
    """Each field as a rows × columns array, read once (blocks of a series, or one sample per
    row)."""
    blocks = "block_rows" in series
    out: dict[str, np.ndarray] = {}
    for n in names:
        f = base.schema[n]
        shape = f.shape  # type: ignore[attr-defined]
        row = shape[1:] if blocks and shape else shape
        if shape is None or None in row or (blocks and (not shape or shape[0] is not None)):
            raise ConfigError(f"{n!r}: {base.root} stores it with shape {shape}; windows need "
                              "one fixed-shape value per row (pack the series with "
                              "series=True, or one row per sample)", option="features")
        rows = int(series["rows"]) if blocks else len(base)
        out[n] = np.empty((rows, *row), np.dtype(f.dtype))  # type: ignore[attr-defined]
    at = [0, 0]  # the next row to fill, the sample being read

    def put(pos: int, stored: dict[str, Any]) -> None:
        if not blocks:
            for n in names:
                out[n][at[1] + pos] = stored[n]
            return
        k = len(stored[names[0]])
        for n in names:
            if len(stored[n]) != k or at[0] + k > len(out[n]):
                raise DamagedDataError(f"{base.root}: block {at[1] + pos} does not fit the series "
                                       f"of {len(out[n])} rows its manifest records")
            out[n][at[0]:at[0] + k] = stored[n]
        at[0] += k

    step = 16 if blocks else _READ
    for first in range(0, len(base), step):
        at[1] = first
        base.visit(range(first, min(len(base), first + step)), put, names)
    if blocks and at[0] != int(series["rows"]):
        raise DamagedDataError(f"{base.root}: blocks hold {at[0]} rows, the manifest records "
                               f"{series['rows']}")
    return {n: a.reshape(len(a), -1) for n, a in out.items()}


def _rows(split: Split, rows: int, series: dict[str, Any]) -> tuple[int, int]:
    """The row range (lo, hi) windows are cut from."""
    if split is None or split == "all":
        return 0, rows
    if isinstance(split, str):
        if split not in ("train", "val") or "train_rows" not in series:
            raise ConfigError(f"split={split!r}: 'train' and 'val' name the rows before and from "
                              "the conversion's train_fraction" + ("" if "train_rows" in series
                                                                   else ", and this series was "
                                                                   "packed without one")
                              + "; or pass (start, stop) fractions or rows", option="split")
        k = int(series["train_rows"])
        return (0, k) if split == "train" else (k, rows)
    if not isinstance(split, (tuple, list)) or len(split) != 2:
        raise ConfigError(f"split={split!r}: None, 'train', 'val', or (start, stop)",
                          option="split")
    a, b = split
    if any(isinstance(v, (float, np.floating)) for v in split):
        if not 0.0 <= a < b <= 1.0:
            raise ConfigError(f"split={split!r}: fractions with 0 <= start < stop <= 1",
                              option="split")
        return round(a * rows), round(b * rows)
    if not 0 <= int(a) < int(b) <= rows:
        raise ConfigError(f"split={split!r}: rows with 0 <= start < stop <= {rows}",
                          option="split")
    return int(a), int(b)


def _touches(bad: np.ndarray, starts: np.ndarray, a: int, b: int) -> np.ndarray:
    """Per window start ``s``: whether any of rows ``s+a .. s+b-1`` is ``bad``."""
    c = np.concatenate([[0], np.cumsum(bad)])
    return (c[starts + b] - c[starts + a]) > 0


def _ffill(a: np.ndarray) -> np.ndarray:
    """Each column's NaNs and infinities replaced by the last value before them (leading ones
    become NaN)."""
    a = np.where(np.isinf(a), np.nan, a)
    nan = np.isnan(a)
    if not nan.any():
        return a
    idx = np.where(~nan, np.arange(len(a))[:, None], 0)
    np.maximum.accumulate(idx, axis=0, out=idx)
    return np.take_along_axis(a, idx, axis=0)


def _stat(stats: dict[str, Any], name: str, key: str, base: DatasetReader) -> np.ndarray:
    if name not in stats:
        raise ConfigError(f"normalize=True: no statistics for {name!r} in {base.root}",
                          option="normalize")
    v = np.asarray(stats[name][key], dtype=object).reshape(-1)
    if any(e is None for e in v):
        raise ConfigError(f"normalize=True: {name!r} has no finite value in the training rows "
                          "(all NaN or infinite), so it has no mean or std", option="normalize")
    return v.astype(np.float64)


def _gap_message(base: DatasetReader, cols: dict[str, np.ndarray], features: list[str],
                 targets: list[str], lo: int, hi: int) -> str:
    parts = []
    for n in dict.fromkeys([*features, *targets]):
        bad = np.flatnonzero((~np.isfinite(cols[n][lo:hi])).any(axis=1)) + lo if \
            cols[n].dtype.kind == "f" else np.array([], int)
        if len(bad):
            parts.append(f"{n} in {len(bad)} rows (first {', '.join(map(str, bad[:5]))})")
    return (f"{base.root}: missing values (NaN or infinite) in rows {lo}..{hi - 1}: "
            f"{'; '.join(parts)}; "
            "pass gaps='skip' (leave out the windows that touch one) or gaps='fill' (forward "
            "fill)")
