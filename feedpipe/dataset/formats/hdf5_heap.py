"""HDF5 global heap collections, parsed from a file's bytes: where variable-length rows
(sequences, strings, bytes) keep their data. Used by the mapped reader (:mod:`.hdf5_layout`) and
by the check that runs before libhdf5 parses a collection (:class:`HeapGuard`).

A collection (HDF5 file format, "Global Heap") is ``GCOL``, version 1, 3 reserved bytes and its
size (u8, the header included; at least 4 KiB), then objects: index (u2, 0 is the free space),
reference count (u2), 4 reserved bytes, size (u8), the data padded to 8 bytes. Every record is
bounds-checked against the collection and the file.

Why the guard: libhdf5 decodes a whole collection when it reads any object in it, walking its
objects by their sizes, and a free-space object (index 0) of size 0 -- a zeroed page inside a
collection -- sends that walk round the same 16 bytes forever, in C, at 100% CPU, where no signal
or timeout can stop it (H5HG cache deserialize, HDF5 2.0 as h5py 3.16 ships it). Every collection
a read through h5py could decode is walked here first, once, by the same rules and bounded.
"""

from __future__ import annotations

import struct

import numpy as np

from ...errors import CorruptRecordError

HEAP = np.dtype([("magic", "S4"), ("version", "u1"), ("pad", "V3"), ("size", "<u8")])
OBJ = np.dtype([("index", "<u2"), ("refs", "<u2"), ("pad", "V4"), ("size", "<u8")])
SPAN = np.arange(16)  # a collection's header, an object's header and a vlen record: 16 bytes
_OBJ_HEAD = struct.Struct("<H6xQ")  # an object's index and size


def heap_objects(raw: np.ndarray, addr: np.ndarray, index: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """File offsets and sizes of the global heap objects ``index`` in the collections at
    ``addr`` (one pair per row, vectorized over rows) in the file's bytes ``raw``; None if a
    collection's header or objects do not parse, or hold no such index."""
    size = len(raw)
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
        return collection_problem(self.raw, addr, self._mv)


def collection_problem(raw: np.ndarray, addr: int, mv: memoryview | None = None) -> str | None:
    """Why the global heap collection at byte ``addr`` of ``raw`` would not parse (walked as
    libhdf5 walks it), or None."""
    if mv is None:
        mv = memoryview(raw)  # type: ignore[arg-type]
    if addr + 16 > len(raw):
        return "it lies past the end of the file"
    head = raw[addr: addr + 16].view(HEAP)[0]
    end = addr + int(head["size"])
    if head["magic"] != b"GCOL" or head["version"] != 1:
        return "bad signature or version"
    if not addr + 4096 <= end <= len(raw):  # HDF5 writes collections of 4 KiB or more
        return f"its size {int(head['size'])} does not fit the file"
    p, unpack = addr + 16, _OBJ_HEAD.unpack_from
    while p < end:
        if p + 16 > end:  # too small for an object: the free tail
            break
        index, size = unpack(mv, p)
        need = 16 + ((size + 7) & ~7) if index else size
        if need < 16 or p + need > end:  # a step of 0 is libhdf5's endless loop
            return f"object {index} at byte {p} has size {size}"
        p += need
    return None


__all__ = ["HEAP", "HeapGuard", "OBJ", "SPAN", "collection_problem", "heap_objects"]
