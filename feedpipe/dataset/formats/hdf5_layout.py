"""The HDF5 file format's chunk records, read from the mapped ``data.h5`` (file format 1.x/2.0,
little-endian, 8-byte addresses and lengths, no user block):

- the rows of a dataset chunked along its first axis, found by their chunk's offset
  (:class:`Mapped`; small fixed-size rows: :class:`MappedFixed`);
- a variable-length row's record in its chunk: its length (u4), the address of a global heap
  collection (u8) and its object index there (u4) (:class:`VlenRecords`), and the row's bytes
  in that collection (:class:`MappedVlen`; the collections themselves are parsed in
  :mod:`.hdf5_heap`).
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

from .hdf5_heap import SPAN, heap_objects

ROW = np.dtype([("n", "<u4"), ("addr", "<u8"), ("index", "<u4")])  # a vlen row in its chunk


def is_vlen(ds: h5py.Dataset) -> bool:
    """Whether ``ds`` holds variable-length rows (sequences or strings): kept in global heaps."""
    text = h5py.check_string_dtype(ds.dtype)
    return h5py.check_vlen_dtype(ds.dtype) is not None or (text is not None
                                                            and text.length is None)


class Mapped:
    """Rows of a dataset chunked along its first axis only, unfiltered and not virtual, found in
    the mapped file by their chunk's offset (HDF5's chunk index, asked once per chunk) in a file
    with 8-byte addresses and lengths and no user block. :meth:`read` returns None where the
    file's records do not parse."""

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


class MappedFixed(Mapped):
    """Small fixed-size rows (labels, checksums, shape companions) gathered from the mapping."""

    @classmethod
    def of(cls, ds: h5py.Dataset, raw: np.ndarray) -> MappedFixed | None:
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


class VlenRecords(Mapped):
    """The records of a 1-D variable-length dataset (sequences or strings): per row its length,
    heap collection address and object index."""

    @classmethod
    def of(cls, ds: h5py.Dataset, raw: np.ndarray) -> Any:
        return cls(ds, raw, ROW.itemsize) if ds.ndim == 1 and is_vlen(ds) and cls.fits(ds) \
            else None

    def records(self, uniq: np.ndarray) -> np.ndarray | None:
        """Rows ``uniq``'s records (:data:`ROW`); None if a chunk cannot be found."""
        pos = self._rows(uniq)
        return None if pos is None else self.raw[pos[:, None] + SPAN].view(ROW)[:, 0]


class MappedVlen(VlenRecords):
    """The rows of a 1-D uint8 variable-length dataset, read as views of the mapped file (their
    bytes found in their global heap collections by :func:`~.hdf5_heap.heap_objects`)."""

    @classmethod
    def of(cls, ds: h5py.Dataset, raw: np.ndarray) -> MappedVlen | None:
        ok = ds.ndim == 1 and h5py.check_vlen_dtype(ds.dtype) == np.uint8 and cls.fits(ds)
        return cls(ds, raw, ROW.itemsize) if ok else None

    def read(self, uniq: np.ndarray) -> list[np.ndarray] | None:
        """Rows ``uniq`` as uint8 views of the file; None if any row's records do not parse."""
        row = self.records(uniq)
        if row is None:
            return None
        n, off = row["n"].astype(np.int64), np.zeros(len(uniq), np.int64)
        live = np.flatnonzero(n)  # an empty row has no heap object (its address is 0)
        found = heap_objects(self.raw, row["addr"][live].astype(np.int64),
                             row["index"][live])
        if found is None or (found[1] != n[live]).any():
            return None
        off[live] = found[0]
        return [self.raw[o: o + k] for o, k in zip(off.tolist(), n.tolist())]
