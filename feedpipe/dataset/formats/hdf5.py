"""HDF5: one file, ``data.h5``, one contiguous dataset per stored column (layout: docs/convert.md,
"On-disk formats"), read as views of the mapped file.

The writer spools each column to a file while samples come (a full disk is a plain ENOSPC), and
writes the datasets at close. Variable-length values are bytes plus an offsets dataset, never an
HDF5 variable-length type, whose damaged global heap sent libhdf5 into an endless loop. The
reader uses h5py only to check each dataset (a hard link of the schema's dtype and shape, not
external or virtual: HDF5 would read another file) and the root's ``dataset_id``; libhdf5 reads
no sample. A merged dataset is its parts' files, read as one.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO, Literal, Sequence

import h5py
import numpy as np

from ...errors import (
    ConfigError,
    CorruptRecordError,
    DamagedDataError,
    ResourceError,
    UnsafeDataError,
)
from ...schema.codecs import crc32
from ...schema.fields import ArrayField, BytesField, Field, ImageField, JsonField, LabelField
from ...schema.masks import MaskField
from ...schema.model import Schema
from ...system import file_size_limit
from ..manifest import Manifest
from .base import DatasetReader, DatasetWriter, Visitor, unsafe_name

FILE_NAME = "data.h5"
CRC_NAME = "_feedpipe.crc32"  # not an identifier, so no field can be called that
ID_ATTR = "dataset_id"  # the root's attribute (fixed-length ASCII): the manifest's extra.dataset_id
OFFSETS, SHAPE = "__offsets", "__shape"  # a variable-length field's companion datasets
FIXED, LABEL, JSON, BLOB, BYTES, ARRAY = range(6)  # how a field is stored (:func:`kind`)
_HEADROOM = 1 << 20  # free bytes kept beyond the data, for HDF5's metadata
_COPY = 64 << 20  # bytes a spool hands HDF5 per write at close
Compression = Literal["lzf", "gzip"] | None


def kind(f: Field) -> int:
    """FIXED (an N×shape dataset), LABEL (int64), or the bytes of each value back to back with
    N+1 offsets (``>= JSON``): JSON (UTF-8), BLOB (encoded images), BYTES, ARRAY (raw values,
    and a shape)."""
    if isinstance(f, (ImageField, MaskField)) and f.codec == "raw" and f.shape is not None \
            or isinstance(f, ArrayField) and f.fixed:
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
            out[f.name] = base_dtype(f), f.shape  # type: ignore[attr-defined]
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
        """Refuse a ``data.h5`` of ``need`` bytes the filesystem (or the file size limit) cannot
        hold: libhdf5 crashes (SIGSEGV) when a write meets a full disk."""
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
        if self._spools is not None:  # tell() counts what is still buffered
            self._check_space(_HEADROOM + sum(fh.tell() for fh in self._spools.values()))
            self.discard()
            with h5py.File(self.root / FILE_NAME, "w") as out:
                for name, (dt, shape) in columns(self.schema).items():
                    self._dataset(out, name, dt, shape)
                out.attrs["num_samples"] = self.count
                out.attrs[ID_ATTR] = np.bytes_(self.dataset_id())
        return [FILE_NAME], {"compression": self.compression, "dataset_id": self.dataset_id()}

    def _dataset(self, out: h5py.File, name: str, dt: np.dtype, shape: tuple[int, ...]) -> None:
        """Dataset ``name`` from its spool (then removed): contiguous, or one sample a chunk where
        a fixed-shape field is compressed."""
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


_DAMAGE = (OSError, KeyError, ValueError, RuntimeError, CorruptRecordError)
Columns = dict[str, "np.ndarray | h5py.Dataset"]  # a part's datasets: mapped views, or h5py's


class Hdf5Reader(DatasetReader):
    """Reads each field of a batch in one pass over sorted, de-duplicated indices, part by part,
    from the mapped files."""

    format_name = "hdf5"
    _handles = ("_h5", "_cols")

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest | None = None) -> None:
        super().__init__(root, manifest)
        self._files, self._ids, self._ends = self.parts(FILE_NAME)
        self._starts = np.concatenate([[0], self._ends[:-1]])
        self._layout = columns(self.schema)
        self._plan = {f.name: (kind(f), base_dtype(f), self.schema.names.index(f.name))
                      for f in self.schema}

    def _open(self) -> None:
        self._h5: list[h5py.File] = []
        self._cols: list[Columns] = []
        name = self._files[0]
        try:
            for name, id_, n in zip(self._files, self._ids, np.diff(self._ends, prepend=0), strict=True):
                self._cols.append(self._open_file(name, id_, int(n)))
        except (OSError, KeyError, ValueError, RuntimeError) as exc:  # not HDF5, cut, damaged
            self._close_files()
            raise CorruptRecordError(f"{self.root / name}: damaged HDF5 file ({exc}); "
                                     "re-convert the dataset", dataset=self.root) from exc
        except BaseException:
            self._close_files()
            raise

    def _open_file(self, name: str, dataset_id: object, n: int) -> Columns:
        """File ``name`` of the dataset (``n`` samples), after its size and dataset id were found
        to be the ones the manifest recorded: its datasets, each checked (:meth:`_dataset`)."""
        path = self.root / name
        self.check_size(name, os.stat(path).st_size)
        h5 = h5py.File(path, "r")
        self._h5.append(h5)
        self.check_id(name, h5.attrs.get(ID_ATTR), dataset_id)
        with open(path, "rb") as fh:  # the mapping outlives the descriptor and its views
            size = os.fstat(fh.fileno()).st_size
            raw = np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                                if size else b"", np.uint8)
        return {col: self._dataset(h5, raw, col, n, path) for col in self._layout}

    def _dataset(self, h5: h5py.File, raw: np.ndarray, name: str, n: int,
                 path: Path) -> np.ndarray | h5py.Dataset:
        """Dataset ``name`` as a view of the mapped file ``raw`` (h5py's where compressed), refused
        before HDF5 reads it if it is a link, virtual, external, or not the schema's layout."""
        link = h5.get(name, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            raise DamagedDataError(f"{path}: {name!r} is an external link to "
                                   f"{link.filename!r}: a dataset's HDF5 file never names "
                                   "another file; refusing to open it", dataset=self.root)
        if not isinstance(link, h5py.HardLink) or not isinstance(h5[name], h5py.Dataset):
            raise CorruptRecordError(f"{path}: {name!r} is " + (
                "missing" if link is None else "not a dataset") + " (feedpipe writes a dataset "
                "there); refused", dataset=self.root)
        ds = h5[name]
        if ds.external or ds.is_virtual:
            raise DamagedDataError(f"{path}: dataset {name!r} reads other files ("
                                   + (f"external file(s) {[e[0] for e in ds.external]}"
                                     if ds.external else "a virtual dataset") + "): a "
                                   "dataset's HDF5 file never names another file; refusing to "
                                   "open it", dataset=self.root)
        dt, shape = self._layout[name]
        rows = n + 1 if name.endswith(OFFSETS) else n
        if ds.dtype != dt:
            cls = UnsafeDataError if ds.dtype.kind in "OV" else CorruptRecordError
            raise cls(f"{path}: dataset {name!r} is stored as {ds.dtype}, not the {dt} this "
                      "dataset's schema writes; refused", dataset=self.root)
        if ds.ndim != 1 + len(shape) or ds.shape[1:] != shape or \
                (name not in self._plan or self._plan[name][0] < JSON) and len(ds) != rows:
            raise CorruptRecordError(f"{path}: dataset {name!r} is {ds.shape}, not "
                                     f"{(rows, *shape)}", dataset=self.root)
        at, size = ds.id.get_offset(), ds.id.get_storage_size()
        if ds.chunks is not None:  # compressed: h5py reads it
            return ds
        if size != ds.size * dt.itemsize or (size and (at is None or at + size > len(raw))):
            raise CorruptRecordError(f"{path}: dataset {name!r}: its {size} bytes at {at} do "
                                     "not lie in the file", dataset=self.root)
        return raw[at: at + size].view(dt).reshape(ds.shape) if size else \
            np.zeros(ds.shape, dt)

    def _parts(self, uniq: np.ndarray) -> list[tuple[Columns, np.ndarray]]:
        """Each part holding rows of ``uniq`` (sorted): its datasets and its rows there."""
        if len(self._cols) == 1:
            return [(self._cols[0], uniq)]
        which = np.searchsorted(self._ends, uniq, side="right")
        return [(self._cols[k], uniq[which == k] - self._starts[k])
                for k in np.unique(which).tolist()]

    def _read(self, name: str, uniq: np.ndarray, blobs: bool = False) -> Any:
        """Rows ``uniq`` of dataset ``name``; with ``blobs``, the values stored back to back
        (views; None where a row's offsets do not lie in the data)."""
        got = []
        for cols, rows in self._parts(uniq):
            if not blobs:
                got.append(cols[name][rows])
                continue
            start, end, data = cols[name + OFFSETS][rows], cols[name + OFFSETS][rows + 1], \
                cols[name]
            fine = ((0 <= start) & (start <= end) & (end <= len(data))).tolist()
            got.append([data[a: b] if ok else None
                        for a, b, ok in zip(start.tolist(), end.tolist(), fine, strict=True)])
        if len(got) == 1:
            return got[0]
        return [v for g in got for v in g] if blobs else np.concatenate(got)

    def _columns(self, fields: list[Field], uniq: np.ndarray) -> tuple[list[Any], list[Any]]:
        """Per field its name, kind, dtype, checksum column, rows ``uniq`` and (ARRAY) their
        shapes; and the rows' checksums."""
        cols = [(f.name, k, dt, c, self._read(f.name, uniq, k >= JSON),
                 self._read(f.name + SHAPE, uniq) if k == ARRAY else None)
                for f in fields for k, dt, c in [self._plan[f.name]]]
        return cols, self._read(CRC_NAME, uniq).tolist()

    def _visit(self, indices: Sequence[int], fn: Visitor, fields: list[Field]) -> None:
        idx = np.asarray(indices, dtype=np.int64)
        if not len(idx):  # an empty batch reads nothing
            return
        uniq, inverse = np.unique(idx, return_inverse=True)
        try:
            cols, crcs = self._columns(fields, uniq)
        except _DAMAGE as exc:  # a damaged compressed chunk (h5py reads those): find its sample
            bad = int(idx[0])
            for i in uniq.tolist() if len(uniq) > 1 else ():
                try:
                    self._columns(fields, np.array([i]))
                except _DAMAGE:
                    bad = i
                    break
            raise self.corrupt(bad, f"HDF5 read failed: {exc!r}") from exc
        for pos, (i, u) in enumerate(zip(idx.tolist(), inverse.tolist(), strict=True)):
            stored = {}
            try:  # error context is formatted only on failure: this loop is the hot path
                for name, k, dt, c, col, shp in cols:
                    v = col[u]
                    if v is None:
                        raise CorruptRecordError(f"field {name!r}: its offsets are damaged")
                    shape = shp[u] if shp is not None else None
                    if crc32(col[u: u + 1] if k == LABEL else v,
                             0 if shape is None else crc32(shape)) != crcs[u][c]:
                        raise CorruptRecordError(f"field {name!r} fails its checksum")
                    if k == LABEL:
                        v = int(v)
                    elif k == JSON:
                        v = json.loads(v.tobytes())
                    elif k == BYTES:
                        v = v.tobytes()
                    elif k == ARRAY:  # a copy where the view may be unaligned
                        v = (v.view(dt) if dt.itemsize == 1 else v.view(dt).copy()).reshape(
                            tuple(int(d) for d in shp[u] if d >= 0))
                    stored[name] = v
            except Exception as exc:  # a bad checksum, JSON or shape: this sample is damaged
                raise self.corrupt(i, f"damaged record: {exc}") from exc
            fn(pos, stored)

    def stray_entries(self) -> list[str]:
        self._ensure_open()
        return [f"{h5.filename}: dataset {name!r} belongs to no field"
                + (" (a pickle: never read)" if unsafe_name(name) else "")
                + (" (an external link: never followed)" if isinstance(
                    h5.get(name, getlink=True), h5py.ExternalLink) else "")
                for h5 in self._h5 for name in h5 if name not in self._layout]

    def _close_files(self) -> None:
        for h5 in self._h5 or ():
            h5.close()
        self._h5 = []

    def close(self) -> None:
        if self._pid == os.getpid():  # not the handles a forked process inherited
            self._close_files()
        self._h5 = self._cols = None  # the mapping goes with its last view
        super().close()

