"""HDF5: one file, ``data.h5``, one contiguous dataset per stored column (layout: docs/convert.md,
"On-disk formats"; the writer: :mod:`.hdf5_write`), read as views of the mapped file.

Variable-length values are bytes back to back plus an offsets dataset, never an HDF5
variable-length type: no global heap, whose damage sent libhdf5 into an endless loop. The reader
opens the file with h5py only to check each dataset (a hard link of the dtype and shape the
schema writes, neither external nor virtual: HDF5 would read another file's bytes, or fill
values for a missing one), then serves the mapped bytes as numpy views (``get_offset``):
libhdf5 reads no sample. The root's ``dataset_id`` and the file's size are compared with the
manifest's first, so another dataset's ``data.h5`` copied in is refused. A merged dataset is its
parts' files (``extra.parts``), read as one. Format versions 1 and 2 are refused: re-convert.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any, Sequence

import h5py
import numpy as np

from ...errors import CorruptRecordError, DamagedDataError, UnsafeDataError
from ...schema.codecs import crc32
from ...schema.fields import Field
from ..manifest import Manifest
from .base import DatasetReader, Visitor, unsafe_name
from .hdf5_write import (
    ARRAY,
    BYTES,
    CRC_NAME,
    FILE_NAME,
    ID_ATTR,
    JSON,
    LABEL,
    OFFSETS,
    SHAPE,
    base_dtype,
    columns,
    kind,
)

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
        """Dataset ``name``, refused before HDF5 follows or reads it if it is a link (an external
        one names another file), virtual or kept in external files, or not of the dtype and
        shape this schema writes; a view of the mapped file ``raw`` where it is contiguous."""
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

