"""HDF5's writer: each stored column spooled to a file beside ``data.h5`` while samples come
(plain Python writes: a full disk is an ENOSPC like any other), then written at close as one
dataset (the layout is described in :mod:`.hdf5`, whose reader shares the names below)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO, Literal

import h5py
import numpy as np

from ...errors import ConfigError, ResourceError
from ...schema.codecs import crc32
from ...schema.fields import ArrayField, BytesField, Field, ImageField, JsonField, LabelField
from ...schema.masks import MaskField
from ...schema.model import Schema
from ...system import file_size_limit
from .base import DatasetWriter

FILE_NAME = "data.h5"
CRC_NAME = "_feedpipe.crc32"  # not an identifier, so no field can be called that
ID_ATTR = "dataset_id"  # the root's attribute (fixed-length ASCII): the manifest's extra.dataset_id
OFFSETS, SHAPE = "__offsets", "__shape"  # a variable-length field's companion datasets
FIXED, LABEL, JSON, BLOB, BYTES, ARRAY = range(6)  # how a field is stored (:func:`kind`)
_HEADROOM = 1 << 20  # free bytes kept beyond the data, for HDF5's metadata
_COPY = 64 << 20  # bytes a spool hands HDF5 per write at close
Compression = Literal["lzf", "gzip"] | None


def fixed_shape(f: Field) -> tuple[int, ...] | None:
    if isinstance(f, (ImageField, MaskField)) and f.codec == "raw":
        return f.shape
    if isinstance(f, ArrayField) and f.fixed:
        return f.shape  # type: ignore[return-value]
    return None


def kind(f: Field) -> int:
    """FIXED (an N×shape dataset), LABEL (int64), or the bytes of each value back to back with
    N+1 offsets (``>= JSON``): JSON (UTF-8), BLOB (encoded images), BYTES, ARRAY (raw values,
    and a shape)."""
    if fixed_shape(f) is not None:
        return FIXED
    if isinstance(f, LabelField):
        return LABEL
    if isinstance(f, JsonField):
        return JSON
    if isinstance(f, BytesField):
        return BYTES
    if isinstance(f, (ImageField, MaskField)) and f.codec != "raw":
        return BLOB
    return ARRAY


def base_dtype(f: Field) -> np.dtype:
    """The dtype of a FIXED or ARRAY field's elements (uint8 for images)."""
    return np.dtype(f.dtype if isinstance(f, (ArrayField, MaskField)) else np.uint8)


def shape_width(f: Field) -> int:
    """Columns of an ARRAY field's ``__shape`` dataset: its rank (-1 padded to 8 if free)."""
    shape = getattr(f, "shape", None)
    return {ImageField: 3, MaskField: 2}.get(type(f)) or (len(shape) if shape is not None else 8)


def columns(schema: Schema) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Every dataset of ``data.h5`` by name: its dtype and row shape."""
    out: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    for f in schema:
        k = kind(f)
        if k == FIXED:
            out[f.name] = base_dtype(f), fixed_shape(f)  # type: ignore[assignment]
        elif k == LABEL:
            out[f.name] = np.dtype(np.int64), ()
        else:
            out[f.name], out[f.name + OFFSETS] = (np.dtype(np.uint8), ()), (np.dtype(np.int64), ())
            if k == ARRAY:
                out[f.name + SHAPE] = np.dtype(np.int64), (shape_width(f),)
    out[CRC_NAME] = np.dtype(np.uint32), (len(schema),)
    return out


class Hdf5Writer(DatasetWriter):
    """Appends each sample's columns to their spool files; :meth:`close` writes ``data.h5``."""

    format_name = "hdf5"

    def __init__(self, root: Path, schema: Schema, compression: Compression = None) -> None:
        super().__init__(root, schema)
        if compression not in (None, "lzf", "gzip"):
            raise ConfigError(f"compression={compression!r}: HDF5 compression is None, 'lzf' "
                              "or 'gzip'", option="compression")
        self.compression = compression
        self._plan = [(kind(f), base_dtype(f), shape_width(f)) for f in schema]
        self._spools: dict[str, BinaryIO] | None = {
            name: open(self._spool(name), "wb", buffering=1 << 20) for name in columns(schema)}
        self._ends = [0] * len(schema)  # bytes written so far, per field stored back to back
        for f in schema:
            if f.name + OFFSETS in self._spools:
                self._spools[f.name + OFFSETS].write(np.zeros(1, np.int64).tobytes())

    def _spool(self, name: str) -> Path:
        return self.root / f".spool-{name}"

    def _write(self, index: int, values: list[Any]) -> None:
        assert self._spools is not None
        crcs = np.empty(len(values), np.uint32)
        data: Any
        for j, (f, v, (k, dt, width)) in enumerate(zip(self.schema, values, self._plan, strict=True)):
            out = self._spools[f.name]
            if k == FIXED:
                data = np.ascontiguousarray(v, dt)
            elif k == LABEL:
                data = np.array([v], np.int64)
            elif k == JSON:
                data = json.dumps(v, ensure_ascii=False).encode()
            elif k in (BLOB, BYTES):
                data = bytes(v)
            else:
                shape = np.full(width, -1, np.int64)
                shape[: np.ndim(v)] = np.shape(v)
                self._spools[f.name + SHAPE].write(shape.tobytes())
                data = np.ascontiguousarray(np.ravel(v), dt)
            crcs[j] = crc32(data, crc32(shape) if k == ARRAY else 0)
            out.write(data)
            if k >= JSON:
                self._ends[j] += memoryview(data).nbytes
                self._spools[f.name + OFFSETS].write(np.int64(self._ends[j]).tobytes())
        self._spools[CRC_NAME].write(crcs.tobytes())
        self.content.update(crcs.tobytes())

    def _check_space(self, need: int) -> None:
        """Refuse a ``data.h5`` of ``need`` bytes the output's filesystem (or the file size
        limit) cannot hold: the HDF5 library crashes (SIGSEGV) when a write meets a full disk,
        so it must never get there."""
        free = shutil.disk_usage(self.root).free
        limit = file_size_limit()  # a file size limit crashes it too
        if limit is not None:
            free = min(free, limit)
        if free < need:
            raise ResourceError(f"{self.root / FILE_NAME}: the {self.count} samples need "
                                f"~{need:,} bytes, the filesystem (or file size limit) leaves "
                                f"{free:,}; stopped before HDF5 runs out of space",
                                file=self.root / FILE_NAME, errno=errno.ENOSPC)

    def discard(self) -> None:
        if self._spools is not None:
            for fh in self._spools.values():
                fh.close()
            self._spools = None

    def close(self) -> tuple[list[str], dict[str, Any]]:
        if self._spools is not None:
            for fh in self._spools.values():
                fh.flush()
            self._check_space(_HEADROOM + sum(fh.tell() for fh in self._spools.values()))
            self.discard()
            with h5py.File(self.root / FILE_NAME, "w") as out:
                for name, (dt, shape) in columns(self.schema).items():
                    self._dataset(out, name, dt, shape)
                out.attrs["num_samples"] = self.count
                out.attrs[ID_ATTR] = np.bytes_(self.dataset_id())
        return [FILE_NAME], {"compression": self.compression, "dataset_id": self.dataset_id()}

    def _dataset(self, out: h5py.File, name: str, dt: np.dtype, shape: tuple[int, ...]) -> None:
        """Dataset ``name`` from its spool, which is then removed: contiguous, or chunked one
        sample a chunk where a fixed-shape field is compressed."""
        path = self._spool(name)
        row = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        n = path.stat().st_size // row
        packed = self.compression is not None and name in self.schema and \
            kind(self.schema[name]) == FIXED
        ds = out.create_dataset(name, (n, *shape), dt, chunks=(1, *shape) if packed else None,
                                compression=self.compression if packed else None)
        if n:
            src = np.memmap(path, dt, "r", shape=(n, *shape))
            step = max(1, _COPY // row)
            for a in range(0, n, step):
                ds[a: a + step] = src[a: a + step]
            del src
        os.unlink(path)
