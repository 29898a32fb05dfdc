"""HDF5: one file, one dataset per field (the writer: :mod:`.hdf5_write`).

Fixed-shape raw images and arrays are N×shape datasets chunked one sample per chunk; encoded images,
bytes and variable-shape arrays are variable-length uint8/dtype datasets (variable shapes in a
``<name>__shape`` companion); labels are int64; JSON fields are UTF-8 strings. No compression by
default (it costs decode time on the hot path); ``compression="lzf"|"gzip"`` is an option for the
chunked datasets.

Format version 2 adds ``_feedpipe.crc32`` (N × fields uint32): the crc32 of each stored
value's bytes (a variable shape's companion row first), checked on every read.

The root's attribute ``dataset_id`` (fixed-length ASCII) is the manifest's ``extra.dataset_id``
(:meth:`DatasetWriter.dataset_id`); the reader compares the two, and the file's size with the
manifest's, before it reads a sample: another dataset's ``data.h5`` copied in is refused.

A merged dataset (``feedpipe merge``) is a ``data.h5`` of virtual datasets over its parts' files.
Before HDF5 follows or reads anything, the reader refuses links, external storage and virtual
sources other than plain datasets in files inside the dataset (:mod:`.hdf5_files`): HDF5 would
read another file's bytes, or fill values for a missing one.

The reader maps ``data.h5`` and reads encoded images and bytes (unfiltered chunked uint8 vlen
datasets) as views of the mapping, found by the HDF5 file format's own records (see
:class:`~.hdf5_layout.MappedVlen`): HDF5's vlen read copies each row four times and re-reads its
global heap collection with two system calls, ~20 µs a row. Labels, checksums and shapes are
gathered from the mapping too (h5py's scattered read costs ~1 µs a row). Anything else (JSON,
fixed raw images, virtual, filtered) goes through h5py, after the global heap collections that
read decodes passed :class:`~.hdf5_heap.HeapGuard` (libhdf5 loops forever on some damage).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import h5py
import numpy as np
from h5py import h5s

from ...errors import (
    CorruptRecordError,
    UnsafeDataError,
)
from ...schema.codecs import crc32
from ...schema.fields import BytesField, Field, ImageField, JsonField, LabelField
from ..manifest import Manifest
from .base import DatasetReader, Visitor, unsafe_name
from .hdf5_files import Hdf5File, heap_check, plain_sources
from .hdf5_layout import Mapped, MappedFixed, MappedVlen, is_vlen
from .hdf5_write import (
    CRC_NAME,
    FILE_NAME,
    ID_ATTR,
    Compression,
    Hdf5Writer,
    fixed_shape,
    vlen_base,
)

_DAMAGE = (OSError, KeyError, ValueError, RuntimeError, CorruptRecordError)
_LABEL, _JSON, _BYTES = 1, 2, 3  # field kinds the read loop converts



class Hdf5Reader(DatasetReader):
    """Reads each field of a batch in one pass over sorted, de-duplicated indices: from the
    mapped file where its layout allows (:class:`Mapped`), else with one h5py call, after the
    heap collections that call decodes passed :class:`HeapGuard`."""

    format_name = "hdf5"
    _handles = ("_file", "_ds", "_mapped", "_guards", "_files")

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest | None = None) -> None:
        super().__init__(root, manifest)

    def _open(self) -> None:
        path = self.root / FILE_NAME
        self._files: dict[str, Hdf5File] = {}
        try:
            main = self._open_file(FILE_NAME, self.manifest.extra.get("dataset_id"))
            if self.manifest.extra.get("parts"):  # virtual datasets: their layouts are in heaps
                main.heap.scan()
            self._file = main.h5
            names = [n for f in self.schema for n in (f.name, f"{f.name}__shape")]
            found = {n: main.dataset(n, self.root) for n in [*names, CRC_NAME]}
            n = self._file.attrs.get("num_samples")
            missing = [f.name for f in self.schema if found[f.name] is None]
            if missing or (self.checksums and found[CRC_NAME] is None):
                raise KeyError(f"no dataset {(missing or [CRC_NAME])[0]!r}")
            self._ds = {k: ds for k, ds in found.items() if ds is not None
                        and (k != CRC_NAME or self.checksums)}
            if n is not None and int(n) != len(self):
                raise CorruptRecordError(f"{path}: holds {n} samples, manifest says "
                                         f"{len(self)}", dataset=self.root)
            for f in self.schema:
                self._check_dtype(f, self._ds[f.name].dtype, path)
            crc = self._ds.get(CRC_NAME)
            if crc is not None and crc.shape != (len(self), len(self.schema)):
                raise CorruptRecordError(f"{path}: {CRC_NAME} is {crc.shape}, expected "
                                         f"{(len(self), len(self.schema))}", dataset=self.root)
            guards = {name: self._guard(name, ds, main, path) for name, ds in self._ds.items()}
            self._guards = {name: g for name, g in guards.items() if g is not None}
            self._mapped = self._map(main)
        except (OSError, KeyError, ValueError, RuntimeError) as exc:  # not HDF5, cut, damaged
            self._close_files()
            raise CorruptRecordError(f"{path}: damaged HDF5 file ({exc}); re-convert the "
                                     "dataset", dataset=self.root) from exc
        except BaseException:
            self._close_files()
            raise
        self._col = {f.name: j for j, f in enumerate(self.schema)}

    def _open_file(self, name: str, dataset_id: object) -> Hdf5File:
        """File ``name`` of the dataset, opened once, after its size and then its dataset id
        were found to be the ones the manifest recorded."""
        got = self._files.get(name)
        if got is None:
            self.check_size(name, os.stat(self.root / name).st_size)
            got = self._files[name] = Hdf5File(self.root / name)
            self.check_id(name, got.h5.attrs.get(ID_ATTR), dataset_id)
        return got

    def _map(self, main: Hdf5File) -> dict[str, Mapped]:
        """A mapped reader per dataset laid out as :class:`MappedVlen` (encoded images, bytes)
        or :class:`MappedFixed` (labels, checksums, shapes) read it, each checked on its first
        row against h5py's at open (a dataset laid out otherwise reads through h5py)."""
        out: dict[str, Mapped] = {}
        if not len(self):
            return out
        for name, ds in self._ds.items():
            m = MappedVlen.of(ds, main.raw) or MappedFixed.of(ds, main.raw)
            first = m.read(np.zeros(1, np.int64)) if m is not None else None
            if first is None:
                continue
            if name in self._guards:  # h5py's read of row 0 decodes its collection
                try:
                    self._guards[name](np.zeros(1, np.int64))
                except CorruptRecordError:  # damaged: h5py (guarded) names each lost row
                    continue
            if np.array_equal(first[0], ds[0]):
                out[name] = m
        return out

    def _guard(self, name: str, ds: h5py.Dataset, main: Hdf5File,
               path: Path) -> Callable[[np.ndarray], None] | None:
        """A virtual dataset's sources checked (:func:`plain_sources`, whatever its type); for a
        variable-length dataset, what checks its heap collections before h5py reads rows."""
        if ds.is_virtual:
            ids = {f"{p.get('dir')}/{FILE_NAME}": p.get("dataset_id")
                   for p in self.manifest.extra.get("parts", [])}
            sources = plain_sources(ds, name, path, self.root,
                                    lambda rel: self._open_file(rel, ids.get(rel)))
        else:
            sources = [(0, 0, ds, main)]
        return heap_check(name, sources, self.root) if is_vlen(ds) else None

    def _check_dtype(self, f: Field, dt: np.dtype, path: Path) -> None:
        """The stored dtype is the one the schema implies: never an object, opaque or reference
        type (h5py would hand those over as Python objects)."""
        if isinstance(f, JsonField):
            ok = h5py.check_string_dtype(dt) is not None
        elif fixed_shape(f) is not None:
            want = np.uint8 if isinstance(f, ImageField) else f.dtype  # type: ignore[attr-defined]
            ok = dt == np.dtype(want)
        elif isinstance(f, LabelField):
            ok = dt == np.int64
        else:
            ok = h5py.check_vlen_dtype(dt) == vlen_base(f)
        if not ok:
            cls = UnsafeDataError if dt.kind in "OV" else CorruptRecordError
            raise cls(f"{path}: dataset {f.name!r} is stored as {dt}, not what the schema's "
                      f"{f.kind} field needs; refused", dataset=self.root)

    def _read(self, name: str, uniq: np.ndarray) -> Any:
        mapped = self._mapped.get(name)
        rows = mapped.read(uniq) if mapped is not None else None
        if rows is not None:
            return rows
        guard = self._guards.get(name)
        if guard is not None:  # before h5py decodes the rows' heap collections
            guard(uniq)
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
        except _DAMAGE as exc:  # a damaged chunk or heap: find its sample
            bad = int(idx[0])
            for i in uniq.tolist() if len(uniq) > 1 else ():
                try:
                    self._columns(fields, np.array([i]))
                except _DAMAGE:
                    bad = i
                    break
            raise self.corrupt(bad, str(exc) if isinstance(exc, CorruptRecordError)
                               else f"HDF5 read failed: {exc!r}") from exc
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
                + (" (an external link: never followed)" if isinstance(
                    self._file.get(name, getlink=True), h5py.ExternalLink) else "")
                for name in self._file if name not in known]

    def _close_files(self) -> None:
        for f in (self._files or {}).values():
            f.close()
        self._files = {}

    def close(self) -> None:
        if self._pid == os.getpid():  # not the handles a forked process inherited
            self._close_files()
        self._file = self._mapped = self._files = None  # the mapping goes with its last view
        super().close()


__all__ = ["CRC_NAME", "Compression", "FILE_NAME", "Hdf5Reader", "Hdf5Writer", "ID_ATTR"]
