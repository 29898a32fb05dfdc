"""The HDF5 reader's mapped path (variable-length rows, labels, checksums, shapes): the same
bytes h5py reads, and damage still reported (the mapped parser declines, the heap check before
h5py's read names the sample)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from fp_helpers import flip_byte
from test_writers import write_dataset

import feedpipe
from feedpipe.dataset.formats.hdf5 import CRC_NAME, Hdf5Reader
from feedpipe.dataset.formats.hdf5_heap import HeapGuard
from feedpipe.dataset.registry import sample_key
from feedpipe.errors import CorruptRecordError
from feedpipe.schema.fields import ArrayField, BytesField, LabelField
from feedpipe.schema.model import Schema

SCHEMA = Schema((BytesField("blob"), ArrayField("mask", "uint8", (None, None)),
                 LabelField("label")))
N = 600  # three 256-row chunks, the last partial


def rows(n: int = N) -> list[dict]:
    """Blobs from empty to ~9 KB (small ones share a global heap collection, large ones get
    their own) and uint8 masks with their shapes."""
    rng = np.random.default_rng(3)
    return [{"blob": rng.integers(0, 256, int(rng.choice([0, 3, 40, 700, 9000])),
                                  dtype=np.uint8).tobytes(),
             "mask": rng.integers(0, 256, (i % 5, 3), dtype=np.uint8), "label": i}
            for i in range(n)]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list[dict]]:
    samples = rows()
    return write_dataset("hdf5", tmp_path_factory.mktemp("mapped") / "h5", samples, SCHEMA), \
        samples


def test_mapped_rows_are_h5pys_rows(written):
    root, _ = written
    reader = Hdf5Reader(root)
    reader._ensure_open()
    assert set(reader._mapped) == {"blob", "mask", "mask__shape", "label", CRC_NAME}
    idx = np.arange(N)
    with h5py.File(root / "data.h5", "r") as f:
        for name in reader._mapped:
            got = reader._mapped[name].read(idx)
            assert got is not None  # every row parsed: none fell back to h5py
            want = f[name][:]
            assert len(got) == len(want) == N
            assert all(np.asarray(g).dtype == w.dtype and g.tobytes() == w.tobytes()
                       for g, w in zip(got, want)), name
        assert {len(g) for g in reader._mapped["blob"].read(idx)} == {0, 3, 40, 700, 9000}


def test_batches_read_through_the_mapping(written):
    root, samples = written
    ds = feedpipe.open_dataset(root)
    idx = [599, 0, 256, 255, 17, 17, 512, 3]  # unsorted, duplicated, across chunks
    for i, got in zip(idx, ds.get_batch(idx)):
        s = samples[i]
        assert got["blob"] == s["blob"] and got["label"] == i
        assert got["mask"].tobytes() == s["mask"].tobytes() and got["mask"].shape == \
            s["mask"].shape


def test_views_outlive_the_reader(written):
    root, samples = written
    reader = Hdf5Reader(root)
    kept: list = []
    reader.visit([5, 400], lambda _, stored: kept.append(stored["blob"]))
    reader.close()
    assert [bytes(k) for k in kept] == [samples[5]["blob"], samples[400]["blob"]]


def test_damaged_heap_collection_is_reported(tmp_path):
    root = write_dataset("hdf5", tmp_path / "h5", rows(40), SCHEMA)
    path = root / "data.h5"
    with h5py.File(path, "r") as f:
        ds = f["blob"]
        at = ds.id.get_chunk_info_by_coord((0,)).byte_offset
        rec = np.frombuffer(path.read_bytes(), np.dtype([("n", "<u4"), ("addr", "<u8"),
                                                         ("index", "<u4")]), 40, at)
    victim = next(i for i in range(20, 40) if rec["n"][i] >= 700)  # a row in its own collection
    addr = int(rec["addr"][victim])
    assert path.read_bytes()[addr: addr + 4] == b"GCOL"
    flip_byte(path, addr)  # the collection's signature
    reader, got = Hdf5Reader(root), []
    other = next(i for i in range(40) if rec["n"][i] and rec["addr"][i] != addr)
    reader.visit([other], lambda _, stored: got.append(bytes(stored["blob"])), ["blob"])
    assert got == [rows(40)[other]["blob"]]  # other collections still read
    with pytest.raises(CorruptRecordError, match=f"key {sample_key(victim)}: .*global heap "
                       f"collection at byte {addr} is damaged"):  # refused before h5py reads it
        reader.visit([other, victim], lambda *_: None, ["blob"])


def test_heap_guard_refuses_what_libhdf5_would_loop_on(written):
    """A free-space object of size 0 (a zeroed object header) is where libhdf5's collection
    parser loops forever: the guard walks collections first, bounded, and refuses it; every
    collection of an undamaged file passes."""
    root, _ = written
    raw = np.fromfile(root / "data.h5", np.uint8)
    HeapGuard(raw, root).scan()
    heap = raw.tobytes().find(b"GCOL")
    size = int(raw[heap + 24: heap + 32].view("<u8")[0])  # the first object's
    second = heap + 32 + (size + 7) // 8 * 8
    bad = raw.copy()
    bad[second: second + 16] = 0
    with pytest.raises(CorruptRecordError, match=f"collection at byte {heap} is damaged "
                                                 rf"\(object 0 at byte {second} has size 0\)"):
        HeapGuard(bad, root).scan()
