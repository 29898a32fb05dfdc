"""The HDF5 file format's own records, read from the mapped ``data.h5`` (file format 1.x/2.0,
little-endian, 8-byte addresses and lengths, no user block):

- the rows of a dataset chunked along its first axis, found by their chunk's offset
  (:class:`Mapped`; small fixed-size rows: :class:`MappedFixed`);
- a variable-length row's record in its chunk: its length (u4), the address of a global heap
  collection (u8) and its object index there (u4) (:class:`VlenRecords`), and the row's bytes
  in that collection (:class:`MappedVlen`);
- global heap collections checked before libhdf5 parses one (:class:`HeapGuard`).

Why the guard: libhdf5 decodes a whole collection when it reads any object in it, walking its
objects by their sizes, and a free-space object (index 0) of size 0 -- a zeroed page inside a
collection -- sends that walk round the same 16 bytes forever, in C, at 100% CPU, where no signal
or timeout can stop it (H5HG cache deserialize, HDF5 2.0 as h5py 3.16 ships it). Every collection
a read through h5py could decode is walked here first, once, by the same rules and bounded.
"""

from __future__ import annotations

import struct
from typing import Any

import h5py
import numpy as np

from ...errors import CorruptRecordError

ROW = np.dtype([("n", "<u4"), ("addr", "<u8"), ("index", "<u4")])  # a vlen row in its chunk
HEAP = np.dtype([("magic", "S4"), ("version", "u1"), ("pad", "V3"), ("size", "<u8")])
OBJ = np.dtype([("index", "<u2"), ("refs", "<u2"), ("pad", "V4"), ("size", "<u8")])
SPAN = np.arange(16)  # each of the three records is 16 bytes
_OBJ_HEAD = struct.Struct("<H6xQ")  # an object's index and size


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
    """The rows of a 1-D uint8 variable-length dataset, read as views of the mapped file.

    A collection is ``GCOL``, version, 3 reserved bytes, its size (u8), then objects: index (u2),
    reference count (u2), 4 reserved bytes, size (u8), the data padded to 8 bytes. Every record is
    bounds-checked.
    """

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
        heap = raw[addr[:, None] + SPAN].view(HEAP)[:, 0]
        end = addr + heap["size"].astype(np.int64)
        if (heap["magic"] != b"GCOL").any() or ((end <= addr) | (end > size)).any():
            return None
        ptr, off, got = addr + 16, np.zeros_like(addr), np.zeros_like(addr)
        todo = np.arange(len(addr))
        while len(todo):  # walk each collection's objects to the row's index (usually the first)
            at = ptr[todo]
            if (at + 16 > end[todo]).any():  # past the collection: the index is not there
                return None
            obj = raw[at[:, None] + SPAN].view(OBJ)[:, 0]
            step = obj["size"].astype(np.int64)
            if (step < 0).any():
                return None
            hit = obj["index"] == index[todo]
            off[todo[hit]], got[todo[hit]] = at[hit] + 16, step[hit]
            ptr[todo] = at + 16 + ((step + 7) & ~7)
            todo = todo[~hit]
        return (off, got) if (off + got <= end).all() else None


class HeapGuard:
    """The global heap collections of one mapped file that libhdf5 may decode: each walked once
    as HDF5 walks it (see the module docstring), and refused unless every object lies inside the
    collection and the walk ends exactly at its end."""

    def __init__(self, raw: np.ndarray, path: object) -> None:
        self.raw, self.path = raw, path
        self._mv = memoryview(raw)  # type: ignore[arg-type]
        self._good: set[int] = set()

    def check(self, rows: np.ndarray | None, what: str) -> None:
        """Check the collections that vlen records ``rows`` (:data:`ROW`) point to; ``None``
        (records not found) and a damaged collection raise CorruptRecordError naming ``what``."""
        if rows is None:
            raise CorruptRecordError(f"{self.path}: {what}: its chunk index or chunk is "
                                     "damaged (a row's record cannot be found)")
        for addr in np.unique(rows["addr"][rows["n"] > 0]).tolist():
            if addr not in self._good:
                problem = self._walk(int(addr))
                if problem:
                    raise CorruptRecordError(f"{self.path}: {what}: the global heap collection "
                                             f"at byte {addr} is damaged ({problem}); "
                                             "re-convert the dataset")
                self._good.add(addr)

    def scan(self) -> None:
        """Check every collection in the file, found by its signature: for a small file whose
        datasets' own records reference collections (a merged dataset's virtual datasets)."""
        raw = self.raw.tobytes()
        at = raw.find(b"GCOL")
        while at >= 0:
            problem = self._walk(at) if at not in self._good else None
            if problem:
                raise CorruptRecordError(f"{self.path}: the global heap collection at byte {at} "
                                         f"is damaged ({problem}); re-convert the dataset")
            self._good.add(at)
            at = raw.find(b"GCOL", at + 4)

    def _walk(self, addr: int) -> str | None:
        """Why the collection at ``addr`` would not parse, or None."""
        raw = self.raw
        if addr + 16 > len(raw):
            return "it lies past the end of the file"
        head = raw[addr: addr + 16].view(HEAP)[0]
        end = addr + int(head["size"])
        if head["magic"] != b"GCOL" or head["version"] != 1:
            return "bad signature or version"
        if not addr + 4096 <= end <= len(raw):  # HDF5 writes collections of 4 KiB or more
            return f"its size {int(head['size'])} does not fit the file"
        p, unpack, mv = addr + 16, _OBJ_HEAD.unpack_from, self._mv
        while p < end:
            if p + 16 > end:  # too small for an object: the free tail
                break
            index, size = unpack(mv, p)
            need = 16 + ((size + 7) & ~7) if index else size
            if need < 16 or p + need > end:  # a step of 0 is libhdf5's endless loop
                return f"object {index} at byte {p} has size {size}"
            p += need
        return None
