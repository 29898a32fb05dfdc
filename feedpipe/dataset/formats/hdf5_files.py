"""The HDF5 files a dataset's reader opens, checked before HDF5 follows or reads anything in them:
no link out of the file, no external storage, a virtual dataset's sources plain datasets inside
the dataset (as ``feedpipe merge`` writes them), and the global heap collections a read decodes
walked first (:class:`~.hdf5_layout.HeapGuard`)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
from h5py import h5s

from ...errors import CorruptRecordError, UnsafePathError
from .hdf5_heap import HeapGuard
from .hdf5_layout import VlenRecords

#: a virtual dataset's source: its first row there, its first row in the source dataset, the
#: source dataset and its file
Source = tuple[int, int, h5py.Dataset, "Hdf5File"]


class Hdf5File:
    """One HDF5 file the reader opens (``data.h5``, or a merged dataset's part): its h5py
    handle, its read-only mapping and the guard of its global heap collections."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.h5 = h5py.File(path, "r")
        try:
            with open(path, "rb") as fh:  # the mapping outlives the descriptor and its views
                size = os.fstat(fh.fileno()).st_size
                self.raw = np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                                         if size else b"", np.uint8)
        except BaseException:
            self.h5.close()
            raise
        self.heap = HeapGuard(self.raw, path)

    def dataset(self, name: str, root: Path) -> h5py.Dataset | None:
        """Dataset ``name`` (None if absent), refused before HDF5 follows or reads it if it is
        a link (an external one names another file) or keeps its data in external files;
        errors name the dataset directory ``root``."""
        link = self.h5.get(name, getlink=True)
        if link is None:
            return None
        if isinstance(link, h5py.ExternalLink):
            raise UnsafePathError(f"{self.path}: {name!r} is an external link to "
                                  f"{link.filename!r}: a dataset's HDF5 file never names "
                                  "another file; refusing to open it", dataset=root)
        if not isinstance(link, h5py.HardLink):
            raise CorruptRecordError(f"{self.path}: {name!r} is a soft link to {link.path!r}, "
                                     "not a dataset (feedpipe writes no links); refused",
                                     dataset=root)
        ds = self.h5[name]
        if not isinstance(ds, h5py.Dataset):
            raise CorruptRecordError(f"{self.path}: {name!r} is a group, not a dataset; "
                                     "refused", dataset=root)
        if ds.external:
            raise UnsafePathError(f"{self.path}: dataset {name!r} keeps its data in external "
                                  f"file(s) {[e[0] for e in ds.external]}: a dataset's HDF5 "
                                  "file never names another file; refusing to open it",
                                  dataset=root)
        return ds

    def close(self) -> None:
        self.h5.close()


def plain_sources(ds: h5py.Dataset, name: str, path: Path, root: Path,
                  open_file: Callable[[str], Hdf5File]) -> list[Source]:
    """Virtual dataset ``name``'s sources, refused unless as ``feedpipe merge`` writes them:
    files inside the dataset ``root`` (relative, present; ``open_file`` opens one by its
    relative name, checking it), each a plain dataset whose rows fill the next rows of ``ds``."""
    inside, out, at = root.resolve(), [], 0
    for src in sorted(ds.virtual_sources(), key=lambda s: s.vspace.get_select_bounds()[0]):
        rel = src.file_name
        real = (root / rel).resolve()
        if os.path.isabs(rel) or ".." in rel.split("/") or not real.is_relative_to(inside):
            raise UnsafePathError(f"{path}: virtual dataset {name!r} reads {rel!r}, outside "
                                  "the dataset directory; refusing to open it", dataset=root)
        if not real.is_file():
            raise CorruptRecordError(f"{path}: virtual dataset {name!r} reads {rel!r}, which "
                                     "is missing (HDF5 would return fill values); the dataset "
                                     "is damaged", dataset=root)
        part = open_file(rel)
        sds = part.dataset(src.dset_name, root)
        (v0, *_), (v1, *_) = src.vspace.get_select_bounds()
        whole = src.src_space.get_select_type() == h5s.SEL_ALL  # as merge maps a part
        (s0, *_), (s1, *_) = ((0,), (len(sds) - 1,)) if whole and sds is not None \
            else src.src_space.get_select_bounds()
        if sds is None or sds.is_virtual or v0 != at or v1 - v0 != s1 - s0:
            raise CorruptRecordError(f"{path}: virtual dataset {name!r}: its source "
                                     f"{rel}:{src.dset_name} is not a plain dataset stacked in "
                                     "order, as feedpipe merge writes them; refused",
                                     dataset=root)
        out.append((v0, s0, sds, part))
        at = v1 + 1
    if at != len(ds):
        raise CorruptRecordError(f"{path}: virtual dataset {name!r}: its sources cover {at} of "
                                 f"its {len(ds)} rows; refused", dataset=root)
    return out


def heap_check(name: str, sources: list[Source], root: Path) -> Callable[[np.ndarray], None]:
    """What checks, before h5py reads rows ``uniq`` of variable-length dataset ``name`` (held
    by ``sources``), the heap collections that read decodes. A layout whose records cannot be
    found (filtered, not chunked by rows: feedpipe writes none) is refused."""
    parts = []
    for start, first, sds, part in sources:
        records = VlenRecords.of(sds, part.raw)
        if records is None:
            raise CorruptRecordError(f"{part.path}: variable-length dataset {name!r} is laid out "
                                     "as feedpipe never writes it (filtered, or not chunked by "
                                     "rows), so its heap cannot be checked; refused",
                                     dataset=root)
        parts.append((start, first, records, part.heap))
    starts = np.asarray([p[0] for p in parts], np.int64)
    what = f"dataset {name!r}"

    def check(uniq: np.ndarray) -> None:
        which = np.searchsorted(starts, uniq, side="right") - 1
        for k in np.unique(which).tolist():
            start, first, records, heap = parts[k]
            heap.check(records.records(uniq[which == k] - start + first), what)
    return check
