"""HDF5: one file, one dataset per field.

Fixed-shape raw images and arrays are N×shape datasets chunked one sample per chunk; encoded images,
bytes and variable-shape arrays are variable-length uint8/dtype datasets (variable shapes in a
``<name>__shape`` companion); labels are int64; JSON fields are UTF-8 strings. No compression by
default (it costs decode time on the hot path); ``compression="lzf"|"gzip"`` is an option for the
chunked datasets.

Format version 2 adds ``_feedpipe.crc32`` (N × fields uint32): the crc32 of each stored
value's bytes (a variable shape's companion row first), checked on every read.

A merged dataset (``feedpipe merge``) is a ``data.h5`` of virtual datasets over its parts' files;
the reader refuses a virtual dataset whose source file is missing (HDF5 would read fill values)
or lies outside the dataset.

The reader maps ``data.h5`` and reads encoded images and bytes (unfiltered chunked uint8 vlen
datasets) as views of the mapping, found by the HDF5 file format's own records (see
:class:`_MappedVlen`): HDF5's vlen read copies each row four times and re-reads its global heap
collection with two system calls, ~20 µs a row. Labels, checksums and shapes are gathered from
the mapping too (h5py's scattered read costs ~1 µs a row). Anything else (JSON, fixed raw
images, virtual, filtered) goes through h5py.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import resource
import shutil
from pathlib import Path
from typing import Any, Literal, Sequence

import h5py
import numpy as np
from h5py import h5s

from ...errors import (
    ConfigError,
    CorruptRecordError,
    DiskFullError,
    UnsafeDataError,
    UnsafePathError,
)
from ...schema.codecs import crc32
from ...schema.fields import ArrayField, BytesField, Field, ImageField, JsonField, LabelField
from ...schema.masks import MaskField
from ...schema.model import Schema
from ..manifest import Manifest
from .base import DatasetReader, DatasetWriter, Visitor, unsafe_name

FILE_NAME = "data.h5"
CRC_NAME = "_feedpipe.crc32"  # not an identifier, so no field can be called that
_BLOCK = 256
_LABEL, _JSON, _BYTES = 1, 2, 3  # field kinds the read loop converts
_HEADROOM = 1 << 20  # free bytes kept beyond a block's data, for HDF5's metadata and heaps
Compression = Literal["lzf", "gzip"] | None


_ROW = np.dtype([("n", "<u4"), ("addr", "<u8"), ("index", "<u4")])  # a vlen row in its chunk
_HEAP = np.dtype([("magic", "S4"), ("version", "u1"), ("pad", "V3"), ("size", "<u8")])
_OBJ = np.dtype([("index", "<u2"), ("refs", "<u2"), ("pad", "V4"), ("size", "<u8")])
_SPAN = np.arange(16)  # each of the three records is 16 bytes


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
                              "or 'gzip'", option="compression")
        self.compression = compression
        self._file = h5py.File(self.root / FILE_NAME, "w")
        self._block: list[list[Any]] = []
        for f in schema:
            self._create(f)
        self._file.create_dataset(CRC_NAME, shape=(0, len(schema)), maxshape=(None, len(schema)),
                                  chunks=(4096, len(schema)), dtype=np.uint32)

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

    def _check_space(self) -> None:
        """Refuse a block the output's filesystem cannot hold: the HDF5 library crashes
        (SIGSEGV) when a write meets a full disk, so it must never get there."""
        need = _HEADROOM + sum(len(v) if isinstance(v, (bytes, bytearray, memoryview))
                               else np.asarray(v).nbytes if not isinstance(v, (str, dict, list))
                               else len(json.dumps(v)) for row in self._block for v in row)
        free = shutil.disk_usage(self.root).free
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]  # a file size limit crashes it too
        if limit != resource.RLIM_INFINITY:
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
            if _fixed_shape(f) is not None:
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
        cds = self._file[CRC_NAME]
        cds.resize((n1, len(self.schema)))
        cds[n0:n1] = crcs
        self._block.clear()

    def close(self) -> tuple[list[str], dict[str, Any]]:
        if self._file is not None:
            self._flush()
            self._file.attrs["num_samples"] = self.count
            self._file.close()
            self._file = None
        return [FILE_NAME], {"compression": self.compression}


class _Mapped:
    """Rows of a dataset chunked along its first axis only, unfiltered and not virtual, found in
    the mapped file by their chunk's offset (HDF5's chunk index, asked once per chunk) in a file
    with 8-byte addresses and lengths and no user block. :meth:`read` returns None where the
    file's records do not parse; the caller then reads through h5py (which reports real damage).
    """

    def __init__(self, ds: h5py.Dataset, raw: np.ndarray, row_bytes: int) -> None:
        self.ds, self.raw, self.row_bytes = ds, raw, row_bytes
        self.rows = int(ds.chunks[0])
        self.chunks = np.full(-(-len(ds) // self.rows), -1, np.int64)  # file offsets, on demand

    @staticmethod
    def fits(ds: h5py.Dataset) -> bool:
        """Whether ``ds`` and its file are laid out as this class reads them (see above)."""
        fcpl = ds.file.id.get_create_plist()
        return (not ds.is_virtual and ds.chunks is not None
                and tuple(ds.chunks[1:]) == tuple(ds.shape[1:])
                and ds.id.get_create_plist().get_nfilters() == 0
                and fcpl.get_sizes() == (8, 8) and fcpl.get_userblock() == 0)

    def _rows(self, uniq: np.ndarray) -> np.ndarray | None:
        """The file offset of each row ``uniq``; None if a chunk is missing or filtered."""
        chunk = uniq // self.rows
        base = self.chunks[chunk]
        if (base < 0).any():
            for c in np.unique(chunk[base < 0]).tolist():
                info = self.ds.id.get_chunk_info_by_coord((c * self.rows, *[0] * (
                    self.ds.ndim - 1)))
                at = info.byte_offset
                if at is None or info.filter_mask or info.size != self.rows * self.row_bytes \
                        or at + info.size > len(self.raw):
                    return None
                self.chunks[c] = at
            base = self.chunks[chunk]
        return base + uniq % self.rows * self.row_bytes


class _MappedFixed(_Mapped):
    """Small fixed-size rows (labels, checksums, shape companions) gathered from the mapping."""

    @classmethod
    def of(cls, ds: h5py.Dataset, raw: np.ndarray) -> _MappedFixed | None:
        dt = ds.dtype
        size = dt.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64))
        if dt.kind not in "iuf" or dt.byteorder == ">" or not 0 < size <= 256 \
                or not cls.fits(ds):
            return None
        return cls(ds, raw, size)

    def read(self, uniq: np.ndarray) -> np.ndarray | None:
        pos = self._rows(uniq)
        if pos is None:
            return None
        rows = self.raw[pos[:, None] + np.arange(self.row_bytes)]
        return rows.view(self.ds.dtype.newbyteorder("<")).reshape(len(uniq), *self.ds.shape[1:])


class _MappedVlen(_Mapped):
    """The rows of a 1-D uint8 variable-length dataset, read as views of the mapped file.

    HDF5 file format 1.x/2.0 (all little-endian): a vlen dataset's chunk holds per row its length
    (u4), the address of a global heap collection (u8) and its object index there (u4). A
    collection is ``GCOL``, version, 3 reserved bytes, its size (u8), then objects: index (u2),
    reference count (u2), 4 reserved bytes, size (u8), the data padded to 8 bytes. Every record is
    bounds-checked.
    """

    @classmethod
    def of(cls, ds: h5py.Dataset, raw: np.ndarray) -> _MappedVlen | None:
        ok = ds.ndim == 1 and h5py.check_vlen_dtype(ds.dtype) == np.uint8 and cls.fits(ds)
        return cls(ds, raw, _ROW.itemsize) if ok else None

    def read(self, uniq: np.ndarray) -> list[np.ndarray] | None:
        """Rows ``uniq`` as uint8 views of the file; None if any row's records do not parse."""
        pos = self._rows(uniq)
        if pos is None:
            return None
        row = self.raw[pos[:, None] + _SPAN].view(_ROW)[:, 0]
        n, off = row["n"].astype(np.int64), np.zeros(len(uniq), np.int64)
        live = np.flatnonzero(n)  # an empty row has no heap object (its address is 0)
        found = self._objects(row["addr"][live].astype(np.int64), row["index"][live])
        if found is None or (found[1] != n[live]).any():
            return None
        off[live] = found[0]
        return [self.raw[o: o + k] for o, k in zip(off.tolist(), n.tolist())]

    def _objects(self, addr: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, ...] | None:
        """File offsets and sizes of global heap objects ``index`` in the collections at
        ``addr``; None if a collection's header or objects do not parse or hold no such index."""
        raw, size = self.raw, len(self.raw)
        if ((addr < 0) | (addr + 16 > size)).any():
            return None
        heap = raw[addr[:, None] + _SPAN].view(_HEAP)[:, 0]
        end = addr + heap["size"].astype(np.int64)
        if (heap["magic"] != b"GCOL").any() or ((end <= addr) | (end > size)).any():
            return None
        ptr, off, got = addr + 16, np.zeros_like(addr), np.zeros_like(addr)
        todo = np.arange(len(addr))
        while len(todo):  # walk each collection's objects to the row's index (usually the first)
            at = ptr[todo]
            if (at + 16 > end[todo]).any():  # past the collection: the index is not there
                return None
            obj = raw[at[:, None] + _SPAN].view(_OBJ)[:, 0]
            step = obj["size"].astype(np.int64)
            if (step < 0).any():
                return None
            hit = obj["index"] == index[todo]
            off[todo[hit]], got[todo[hit]] = at[hit] + 16, step[hit]
            ptr[todo] = at + 16 + ((step + 7) & ~7)
            todo = todo[~hit]
        return (off, got) if (off + got <= end).all() else None


class Hdf5Reader(DatasetReader):
    """Reads each field of a batch in one pass over sorted, de-duplicated indices: from the
    mapped file where its layout allows (:class:`_Mapped`), else with one h5py call."""

    format_name = "hdf5"
    _handles = ("_file", "_ds", "_mapped")

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest | None = None) -> None:
        super().__init__(root, manifest)

    def _open(self) -> None:
        path = self.root / FILE_NAME
        try:
            self._file = h5py.File(path, "r")
            n = self._file.attrs.get("num_samples")
            layout = {f.name: self._file[f.name].dtype for f in self.schema}
            crc = self._file[CRC_NAME] if self.checksums else None
        except (OSError, KeyError) as exc:  # truncated, not HDF5, or a dataset missing
            raise CorruptRecordError(f"{path}: damaged HDF5 file ({exc}); re-convert the "
                                     "dataset", dataset=self.root) from exc
        if n is not None and int(n) != len(self):
            raise CorruptRecordError(f"{path}: holds {n} samples, manifest says {len(self)}",
                                     dataset=self.root)
        for f in self.schema:
            self._check_dtype(f, layout[f.name], path)
        self._check_sources(path)
        if crc is not None and crc.shape != (len(self), len(self.schema)):
            raise CorruptRecordError(f"{path}: {CRC_NAME} is {crc.shape}, expected "
                                     f"{(len(self), len(self.schema))}", dataset=self.root)
        self._col = {f.name: j for j, f in enumerate(self.schema)}
        # dataset handles looked up once: ``file[name]`` costs ~20 µs a call, three a batch
        names = [n for f in self.schema for n in (f.name, f"{f.name}__shape") if n in self._file]
        self._ds = {n: self._file[n] for n in names + ([CRC_NAME] if crc is not None else [])}
        self._mapped = self._map(path)

    def _map(self, path: Path) -> dict[str, _Mapped]:
        """A mapped reader per dataset laid out as :class:`_MappedVlen` (encoded images, bytes)
        or :class:`_MappedFixed` (labels, checksums, shapes) read it, each checked on its first
        row against h5py's at open (a dataset laid out otherwise reads through h5py)."""
        if not len(self):
            return {}
        with open(path, "rb") as fh:  # the mapping outlives the descriptor and the views it lends
            raw = np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
        out: dict[str, _Mapped] = {}
        for name, ds in self._ds.items():
            m = _MappedVlen.of(ds, raw) or _MappedFixed.of(ds, raw)
            first = m.read(np.zeros(1, np.int64)) if m is not None else None
            if first is not None and np.array_equal(first[0], ds[0]):
                out[name] = m
        return out

    def _check_dtype(self, f: Field, dt: np.dtype, path: Path) -> None:
        """The stored dtype is the one the schema implies: never an object, opaque or reference
        type (h5py would hand those over as Python objects)."""
        if isinstance(f, JsonField):
            ok = h5py.check_string_dtype(dt) is not None
        elif _fixed_shape(f) is not None:
            want = np.uint8 if isinstance(f, ImageField) else f.dtype  # type: ignore[attr-defined]
            ok = dt == np.dtype(want)
        elif isinstance(f, LabelField):
            ok = dt == np.int64
        else:
            ok = h5py.check_vlen_dtype(dt) == _vlen_base(f)
        if not ok:
            cls = UnsafeDataError if dt.kind in "OV" else CorruptRecordError
            raise cls(f"{path}: dataset {f.name!r} is stored as {dt}, not what the schema's "
                      f"{f.kind} field needs; refused", dataset=self.root)

    def _check_sources(self, path: Path) -> None:
        """Every virtual dataset's source files: relative, inside the dataset, present."""
        inside = self.root.resolve()
        for name in self._file:
            ds = self._file[name]
            if not ds.is_virtual:
                continue
            for src in ds.virtual_sources():
                rel = src.file_name
                real = (self.root / rel).resolve()
                if os.path.isabs(rel) or ".." in rel.split("/") or not real.is_relative_to(inside):
                    raise UnsafePathError(f"{path}: virtual dataset {name!r} reads {rel!r}, "
                                          "outside the dataset directory; refusing to open it")
                if not real.is_file():
                    raise CorruptRecordError(f"{path}: virtual dataset {name!r} reads {rel!r}, "
                                             "which is missing (HDF5 would return fill values); "
                                             "the dataset is damaged", dataset=self.root)

    def _read(self, name: str, uniq: np.ndarray) -> Any:
        mapped = self._mapped.get(name)
        rows = mapped.read(uniq) if mapped is not None else None
        if rows is not None:
            return rows
        ds = self._ds[name]
        if len(uniq) == 1:
            return ds[int(uniq[0]): int(uniq[0]) + 1]
        if uniq[-1] - uniq[0] + 1 == len(uniq):  # a contiguous run: one hyperslab
            return ds[int(uniq[0]): int(uniq[-1]) + 1]
        if ds.ndim == 1 and h5py.check_vlen_dtype(ds.dtype) is not None:
            # scattered variable-length rows: a point selection read directly, ~30% cheaper
            # than h5py's fancy index (a union of one hyperslab per row)
            space = ds.id.get_space()
            space.select_elements(uniq.reshape(-1, 1))
            out = np.empty(len(uniq), dtype=ds.dtype)
            ds.id.read(h5s.create_simple((len(uniq),)), space, out)
            return out
        return ds[uniq]

    def _columns(self, fields: list[Field], uniq: np.ndarray) -> tuple[dict[str, Any], ...]:
        cols: dict[str, Any] = {}
        shapes: dict[str, Any] = {}
        for f in fields:
            cols[f.name] = self._read(f.name, uniq)
            if f"{f.name}__shape" in self._ds:
                shapes[f.name] = self._read(f"{f.name}__shape", uniq)
        crcs = self._read(CRC_NAME, uniq) if self.checksums else None
        return cols, shapes, crcs

    def _visit(self, indices: Sequence[int], fn: Visitor, fields: list[Field]) -> None:
        idx = np.asarray(indices, dtype=np.int64)
        if not len(idx):  # an empty batch reads nothing
            return
        uniq, inverse = np.unique(idx, return_inverse=True)
        try:
            cols, shapes, crcs = self._columns(fields, uniq)
        except (OSError, KeyError, ValueError) as exc:  # a damaged chunk: find its sample
            bad = int(idx[0])
            for i in uniq.tolist() if len(uniq) > 1 else ():
                try:
                    self._columns(fields, np.array([i]))
                except (OSError, KeyError, ValueError):
                    bad = i
                    break
            raise self.corrupt(bad, f"HDF5 read failed: {exc!r}") from exc
        # per field, once a batch: its column, shapes, crc column and kind (the loop below is
        # the hot path: no per-sample lookups or isinstance chains)
        plan = [(f.name, cols[f.name], shapes.get(f.name), self._col[f.name],
                 _LABEL if isinstance(f, LabelField) else _JSON if isinstance(f, JsonField)
                 else _BYTES if isinstance(f, BytesField) else 0) for f in fields]
        crc_rows = crcs.tolist() if crcs is not None else None
        for pos, (i, u) in enumerate(zip(idx.tolist(), inverse.tolist())):
            stored = {}
            try:  # error context is formatted only on failure: this loop is the hot path
                for name, col, shp, c, kind in plan:
                    v = col[u]
                    shape = shp[u] if shp is not None else None
                    if crc_rows is not None:
                        data = col[u: u + 1] if kind == _LABEL else v
                        crc = crc32(data, 0 if shape is None else crc32(shape))
                        if crc != crc_rows[u][c]:
                            raise CorruptRecordError(f"field {name!r} fails its checksum")
                    if kind == _LABEL:
                        v = int(v)
                    elif kind == _JSON:
                        v = json.loads(v)
                    elif shape is not None:
                        v = v.reshape(tuple(int(d) for d in shape if d >= 0))
                    elif kind == _BYTES:
                        v = v.tobytes()
                    stored[name] = v
            except Exception as exc:  # a bad checksum, JSON or shape: this sample is damaged
                raise self.corrupt(i, f"damaged record: {exc}") from exc
            fn(pos, stored)

    def stray_entries(self) -> list[str]:
        self._ensure_open()
        known = {CRC_NAME, *(n for f in self.schema for n in (f.name, f"{f.name}__shape"))}
        return [f"{self.root / FILE_NAME}: dataset {name!r} belongs to no field"
                + (" (a pickle: never read)" if unsafe_name(name) else "")
                for name in self._file if name not in known]

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = self._mapped = None  # the mapping goes with the last view it lent
        super().close()
