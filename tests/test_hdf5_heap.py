"""The global heap parser (feedpipe.dataset.formats.hdf5_heap) against files h5py writes itself:
for every variable-length row (bytes, UTF-8 and ASCII strings, int32 and float64 sequences,
empty rows, rows too big to share a collection), the object the parser finds holds exactly the
bytes h5py reads; every collection walks clean, and a zeroed object size is named."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from feedpipe.dataset.formats.hdf5_heap import HeapGuard, collection_problem, heap_objects
from feedpipe.dataset.formats.hdf5_layout import VlenRecords
from feedpipe.errors import CorruptRecordError

N = 300


def golden(path: Path) -> dict[str, list[bytes]]:
    """Write the golden file with h5py (chunked 1-D vlen datasets of several base types) and
    return each dataset's rows as the bytes h5py would store for them."""
    rng = np.random.default_rng(7)
    sizes = [0 if i % 17 == 0 else int(rng.integers(1, 300)) for i in range(N)]
    sizes[5], sizes[150] = 70_000, 200_000  # bigger than a collection's default 4 KiB
    blobs = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    words = ["" if i % 11 == 0 else "ünïcödé-" * (i % 9) + f"{i}→" for i in range(N)]
    ascii_ = ["" if i % 7 == 0 else f"k{i:05d}" * (1 + i % 4) for i in range(N)]
    ints = [np.arange(i % 13, dtype=np.int32) * (i + 1) for i in range(N)]
    floats = [rng.normal(size=i % 5) for i in range(N)]
    with h5py.File(path, "w") as f:
        f.create_dataset("blob", (N,), h5py.vlen_dtype(np.uint8), chunks=(64,))[:] = blobs
        f.create_dataset("utf8", (N,), h5py.string_dtype("utf-8"), chunks=(100,))[:] = words
        f.create_dataset("ascii", (N,), h5py.string_dtype("ascii"), chunks=(N,))[:] = \
            [w.encode() for w in ascii_]
        f.create_dataset("ints", (N,), h5py.vlen_dtype(np.int32), chunks=(32,))[:] = ints
        f.create_dataset("floats", (N,), h5py.vlen_dtype(np.float64), chunks=(50,))[:] = floats
    return {"blob": [b.tobytes() for b in blobs], "utf8": [w.encode() for w in words],
            "ascii": [w.encode() for w in ascii_],
            "ints": [a.astype("<i4").tobytes() for a in ints],
            "floats": [a.astype("<f8").tobytes() for a in floats]}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict[str, list[bytes]]]:
    path = tmp_path_factory.mktemp("heap") / "golden.h5"
    return path, golden(path)


def h5py_rows(ds: h5py.Dataset) -> list[bytes]:
    """The rows as h5py reads them, as bytes (strings as their stored encoding)."""
    out = []
    for v in ds[()]:
        if isinstance(v, (bytes, str)):
            out.append(v if isinstance(v, bytes) else v.encode())
        else:
            out.append(np.asarray(v).astype(v.dtype.newbyteorder("<")).tobytes())
    return out


@pytest.mark.parametrize("name", ["blob", "utf8", "ascii", "ints", "floats"])
def test_parser_finds_the_bytes_h5py_reads(written, name):
    path, expected = written
    raw = np.fromfile(path, np.uint8)
    with h5py.File(path, "r") as f:
        ds = f[name]
        assert h5py_rows(ds) == expected[name]  # the golden values themselves
        records = VlenRecords.of(ds, raw)
        assert records is not None, "a chunked 1-D vlen dataset in a default file maps"
        rows = records.records(np.arange(N))
        text = h5py.check_string_dtype(ds.dtype) is not None
        unit = 1 if text else np.dtype(h5py.check_vlen_dtype(ds.dtype)).itemsize  # n: elements
    assert rows is not None
    live = np.flatnonzero(rows["n"])
    assert len(live) < N  # some rows are empty: they point to no object
    found = heap_objects(raw, rows["addr"][live].astype(np.int64), rows["index"][live])
    assert found is not None
    off, size = found
    assert (size == rows["n"][live].astype(np.int64) * unit).all()
    got = [b""] * N
    for i, o, k in zip(live.tolist(), off.tolist(), size.tolist()):
        got[i] = raw[o: o + k].tobytes()
    assert got == expected[name]
    if name == "blob":  # the big rows have collections of their own
        big = {int(rows["addr"][5]), int(rows["addr"][150])}
        assert len(big) == 2 and not big & {int(a) for a in np.delete(rows["addr"], [5, 150])}


def test_every_collection_walks_clean(written):
    path, _ = written
    raw = np.fromfile(path, np.uint8)
    found = []
    at = raw.tobytes().find(b"GCOL")
    while at >= 0:
        found.append(at)
        assert collection_problem(raw, at) is None, at
        at = raw.tobytes().find(b"GCOL", at + 4)
    assert len(found) >= 3
    HeapGuard(raw, path).scan()  # raises on any damaged collection


def test_zeroed_object_size_is_named_not_walked_forever(written, tmp_path):
    """A free-space object of size 0 (a zeroed page inside a collection: libhdf5's endless walk)
    is refused by the walk, naming the collection."""
    path, _ = written
    raw = np.fromfile(path, np.uint8)
    with h5py.File(path, "r") as f:
        rows = VlenRecords.of(f["utf8"], raw).records(np.arange(N))
    first = int(rows["addr"][rows["n"] > 0][0])
    bad = raw.copy()
    bad[first + 16: first + 32] = 0  # the collection's first object header: index 0, size 0
    assert "size 0" in collection_problem(bad, first)
    with pytest.raises(CorruptRecordError, match=f"at byte {first}"):
        HeapGuard(bad, tmp_path / "bad.h5").check(rows, "dataset 'utf8'")
