"""HDF5: one file, one dataset per field.

Fixed-shape raw images and arrays are N×shape datasets chunked one sample per chunk; encoded images,
bytes and variable-shape arrays are variable-length uint8/dtype datasets (variable shapes in a
``<name>__shape`` companion); labels are int64; JSON fields are UTF-8 strings. No compression by
default (it costs decode time on the hot path); ``compression="lzf"|"gzip"`` is an option for the
chunked datasets.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, Sequence

import h5py
import numpy as np

from ..errors import ConfigError
from ..manifest import Manifest
from ..schema import (ArrayField, BytesField, Field, ImageField, JsonField, LabelField, MaskField,
                      Schema)
from .base import DatasetReader, DatasetWriter, Visitor

FILE_NAME = "data.h5"
_BLOCK = 256
Compression = Literal["lzf", "gzip"] | None


def _fixed_shape(f: Field) -> tuple[int, ...] | None:
    if isinstance(f, (ImageField, MaskField)) and f.codec == "raw":
        return f.shape
    if isinstance(f, ArrayField) and f.fixed:
        return f.shape  # type: ignore[return-value]
    return None


def _vlen_base(f: Field) -> np.dtype:
    if isinstance(f, ArrayField) or (isinstance(f, MaskField) and f.codec == "raw"):
        return np.dtype(f.dtype)
    return np.dtype(np.uint8)


def _encoded(f: Field) -> bool:
    """Fields stored as opaque encoded bytes (no shape companion)."""
    return isinstance(f, BytesField) or (isinstance(f, (ImageField, MaskField))
                                         and f.codec != "raw")


_MAX_NDIM = 8


def _shape_width(f: Field) -> int:
    """Columns of the ``__shape`` companion: the rank if the schema fixes it, else 8 (-1 padded)."""
    shape = getattr(f, "shape", None)
    return len(shape) if shape is not None else _MAX_NDIM


class Hdf5Writer(DatasetWriter):
    """Appends samples in blocks of 256 to resizable datasets."""

    format_name = "hdf5"

    def __init__(self, root: Path, schema: Schema, compression: Compression = None) -> None:
        super().__init__(root, schema)
        if compression not in (None, "lzf", "gzip"):
            raise ConfigError(f"compression={compression!r}: HDF5 compression is None, 'lzf' "
                              "or 'gzip'")
        self.compression = compression
        self._file = h5py.File(self.root / FILE_NAME, "w")
        self._block: list[list[Any]] = []
        for f in schema:
            self._create(f)

    def _create(self, f: Field) -> None:
        shape = _fixed_shape(f)
        if shape is not None:
            dt = np.uint8 if isinstance(f, ImageField) else np.dtype(f.dtype)  # type: ignore[attr-defined]
            self._file.create_dataset(f.name, shape=(0, *shape), maxshape=(None, *shape), dtype=dt,
                                      chunks=(1, *shape), compression=self.compression)
        elif isinstance(f, LabelField):
            self._file.create_dataset(f.name, shape=(0,), maxshape=(None,), dtype=np.int64,
                                      chunks=(4096,))
        elif isinstance(f, JsonField):
            self._file.create_dataset(f.name, shape=(0,), maxshape=(None,), chunks=(1024,),
                                      dtype=h5py.string_dtype("utf-8"))
        else:  # encoded image, bytes, variable-shape array or raw image
            self._file.create_dataset(f.name, shape=(0,), maxshape=(None,), chunks=(256,),
                                      dtype=h5py.vlen_dtype(_vlen_base(f)))
            if not _encoded(f):
                w = {ImageField: 3, MaskField: 2}.get(type(f)) or _shape_width(f)
                self._file.create_dataset(f"{f.name}__shape", shape=(0, w), maxshape=(None, w),
                                          chunks=(1024, w), dtype=np.int64)

    def _write(self, index: int, values: list[Any]) -> None:
        self._block.append(values)
        if len(self._block) >= _BLOCK:
            self._flush()

    def _flush(self) -> None:
        if not self._block:
            return
        n0 = self._file[self.schema.fields[0].name].shape[0]
        n1 = n0 + len(self._block)
        for j, f in enumerate(self.schema):
            col = [row[j] for row in self._block]
            ds = self._file[f.name]
            ds.resize((n1, *ds.shape[1:]))
            if _fixed_shape(f) is not None:
                ds[n0:n1] = np.stack(col)
            elif isinstance(f, LabelField):
                ds[n0:n1] = np.asarray(col, dtype=np.int64)
            elif isinstance(f, JsonField):
                ds[n0:n1] = [json.dumps(v, ensure_ascii=False) for v in col]
            else:
                # one element at a time: h5py would turn equal-length rows into a 2-D array
                for k, v in enumerate(col):
                    ds[n0 + k] = (np.frombuffer(bytes(v), np.uint8) if isinstance(
                        v, (bytes, bytearray, memoryview)) else np.ravel(v))
                if f"{f.name}__shape" in self._file:
                    sds = self._file[f"{f.name}__shape"]
                    sds.resize((n1, sds.shape[1]))
                    shapes = np.full((len(col), sds.shape[1]), -1, np.int64)
                    for k, v in enumerate(col):
                        shapes[k, : np.ndim(v)] = np.shape(v)
                    sds[n0:n1] = shapes
        self._block.clear()

    def close(self) -> tuple[list[str], dict[str, Any]]:
        if self._file is not None:
            self._flush()
            self._file.attrs["num_samples"] = self.count
            self._file.close()
            self._file = None
        return [FILE_NAME], {"compression": self.compression}


class Hdf5Reader(DatasetReader):
    """Reads each field of a batch with one h5py call (sorted, de-duplicated indices)."""

    format_name = "hdf5"
    _handles = ("_file",)

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest | None = None) -> None:
        super().__init__(root, manifest)

    def _open(self) -> None:
        self._file = h5py.File(self.root / FILE_NAME, "r")
        n = self._file.attrs.get("num_samples")
        if n is not None and int(n) != len(self):
            raise self.corrupt(0, f"{FILE_NAME} holds {n} samples, manifest says {len(self)}")

    def _read(self, name: str, uniq: np.ndarray) -> Any:
        ds = self._file[name]
        if len(uniq) == 1:
            return ds[int(uniq[0]): int(uniq[0]) + 1]
        if uniq[-1] - uniq[0] + 1 == len(uniq):  # a contiguous run: one hyperslab
            return ds[int(uniq[0]): int(uniq[-1]) + 1]
        return ds[uniq]

    def _visit(self, indices: Sequence[int], fn: Visitor, fields: list[Field]) -> None:
        idx = np.asarray(indices, dtype=np.int64)
        if not len(idx):  # an empty batch reads nothing
            return
        uniq, inverse = np.unique(idx, return_inverse=True)
        cols: dict[str, Any] = {}
        shapes: dict[str, Any] = {}
        try:
            for f in fields:
                cols[f.name] = self._read(f.name, uniq)
                if f"{f.name}__shape" in self._file:
                    shapes[f.name] = self._read(f"{f.name}__shape", uniq)
        except (OSError, KeyError, ValueError) as exc:
            raise self.corrupt(int(idx[0]), f"HDF5 read failed: {exc!r}") from exc
        for pos, (i, u) in enumerate(zip(idx.tolist(), inverse.tolist())):
            stored = {}
            for f in fields:
                v = cols[f.name][u]
                if isinstance(f, LabelField):
                    v = int(v)
                elif isinstance(f, JsonField):
                    v = json.loads(v)
                elif f.name in shapes:
                    v = v.reshape(tuple(int(d) for d in shapes[f.name][u] if d >= 0))
                elif isinstance(f, BytesField):
                    v = v.tobytes()
                stored[f.name] = v
            fn(pos, stored)

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None
        super().close()
