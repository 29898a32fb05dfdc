"""HDF5's writer: one file, one dataset per field, appended in blocks (the layout is described in
:mod:`.hdf5`, whose reader shares the names and field helpers below)."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np

from ...errors import (
    ConfigError,
    DiskFullError,
)
from ...schema.codecs import crc32
from ...schema.fields import ArrayField, BytesField, Field, ImageField, JsonField, LabelField
from ...schema.masks import MaskField
from ...schema.model import Schema
from ...system import file_size_limit
from .base import DatasetWriter

FILE_NAME = "data.h5"
CRC_NAME = "_feedpipe.crc32"  # not an identifier, so no field can be called that
ID_ATTR = "dataset_id"  # the root's attribute (fixed-length ASCII): the manifest's extra.dataset_id
_BLOCK = 256
_HEADROOM = 1 << 20  # free bytes kept beyond a block's data, for HDF5's metadata and heaps
Compression = Literal["lzf", "gzip"] | None


def fixed_shape(f: Field) -> tuple[int, ...] | None:
    if isinstance(f, (ImageField, MaskField)) and f.codec == "raw":
        return f.shape
    if isinstance(f, ArrayField) and f.fixed:
        return f.shape  # type: ignore[return-value]
    return None


def vlen_base(f: Field) -> np.dtype:
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
                              "or 'gzip'", option="compression")
        self.compression = compression
        self._file = h5py.File(self.root / FILE_NAME, "w")
        self._block: list[list[Any]] = []
        for f in schema:
            self._create(f)
        self._file.create_dataset(CRC_NAME, shape=(0, len(schema)), maxshape=(None, len(schema)),
                                  chunks=(4096, len(schema)), dtype=np.uint32)

    def _create(self, f: Field) -> None:
        shape = fixed_shape(f)
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
                                      dtype=h5py.vlen_dtype(vlen_base(f)))
            if not _encoded(f):
                w = {ImageField: 3, MaskField: 2}.get(type(f)) or _shape_width(f)
                self._file.create_dataset(f"{f.name}__shape", shape=(0, w), maxshape=(None, w),
                                          chunks=(1024, w), dtype=np.int64)

    def _write(self, index: int, values: list[Any]) -> None:
        self._block.append(values)
        if len(self._block) >= _BLOCK:
            self._flush()

    def _check_space(self) -> None:
        """Refuse a block the output's filesystem cannot hold: the HDF5 library crashes
        (SIGSEGV) when a write meets a full disk, so it must never get there."""
        need = _HEADROOM + sum(len(v) if isinstance(v, (bytes, bytearray, memoryview))
                               else np.asarray(v).nbytes if not isinstance(v, (str, dict, list))
                               else len(json.dumps(v)) for row in self._block for v in row)
        free = shutil.disk_usage(self.root).free
        limit = file_size_limit()  # a file size limit crashes it too
        if limit is not None:
            free = min(free, limit - self._file.id.get_filesize())
        if free < need:
            exc = DiskFullError(f"{self.root / FILE_NAME}: the next {len(self._block)} samples "
                                f"need ~{need:,} bytes, the filesystem (or file size limit) "
                                f"leaves {free:,}; stopped before HDF5 runs out of space",
                                file=self.root / FILE_NAME)
            exc.errno = errno.ENOSPC
            raise exc

    def _flush(self) -> None:
        if not self._block:
            return
        self._check_space()
        n0 = self._file[self.schema.fields[0].name].shape[0]
        n1 = n0 + len(self._block)
        crcs = np.zeros((len(self._block), len(self.schema)), np.uint32)
        for j, f in enumerate(self.schema):
            col = [row[j] for row in self._block]
            ds = self._file[f.name]
            ds.resize((n1, *ds.shape[1:]))
            if fixed_shape(f) is not None:
                block = np.stack(col)
                ds[n0:n1] = block
                crcs[:, j] = [crc32(row) for row in block]
            elif isinstance(f, LabelField):
                labels = np.asarray(col, dtype=np.int64)
                ds[n0:n1] = labels
                crcs[:, j] = [crc32(labels[k: k + 1]) for k in range(len(labels))]
            elif isinstance(f, JsonField):
                texts = [json.dumps(v, ensure_ascii=False) for v in col]
                ds[n0:n1] = texts
                crcs[:, j] = [crc32(s.encode()) for s in texts]
            else:
                shapes = None
                if f"{f.name}__shape" in self._file:
                    sds = self._file[f"{f.name}__shape"]
                    sds.resize((n1, sds.shape[1]))
                    shapes = np.full((len(col), sds.shape[1]), -1, np.int64)
                    for k, v in enumerate(col):
                        shapes[k, : np.ndim(v)] = np.shape(v)
                    sds[n0:n1] = shapes
                # one write per block, straight to HDF5 (``ds[a:b] = rows`` would turn rows of
                # equal length into a 2-D array): the vlen dtype's array of row arrays, filled one
                # by one; in memory only
                rows = np.empty(len(col), dtype=ds.dtype)
                for k, v in enumerate(col):
                    flat = np.ascontiguousarray(np.frombuffer(bytes(v), np.uint8) if isinstance(
                        v, (bytes, bytearray, memoryview)) else np.ravel(v))
                    rows[k] = flat
                    crcs[k, j] = crc32(flat, 0 if shapes is None else crc32(shapes[k]))
                ds.write_direct(rows, dest_sel=np.s_[n0:n1])
        self.content.update(crcs.tobytes())
        cds = self._file[CRC_NAME]
        cds.resize((n1, len(self.schema)))
        cds[n0:n1] = crcs
        self._block.clear()

    def close(self) -> tuple[list[str], dict[str, Any]]:
        if self._file is not None:
            self._flush()
            self._file.attrs["num_samples"] = self.count
            self._file.attrs[ID_ATTR] = np.bytes_(self.dataset_id())
            self._file.close()
            self._file = None
        return [FILE_NAME], {"compression": self.compression, "dataset_id": self.dataset_id()}

