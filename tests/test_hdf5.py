"""The HDF5 layout: every column one contiguous dataset, variable-length values as bytes back to
back plus N+1 offsets (no HDF5 variable-length type, so no global heap), read as views of the
mapped file; damage to the offsets is named by key; files of the older layouts are refused
with the command that re-converts them."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from fp_helpers import rerecord
from test_writers import write_dataset

import feedpipe
from feedpipe.dataset.formats.hdf5 import CRC_NAME, Hdf5Reader
from feedpipe.dataset.manifest import MANIFEST_NAME
from feedpipe.dataset.registry import sample_key
from feedpipe.errors import CorruptRecordError, DamagedDataError, UnsafeDataError
from feedpipe.schema.fields import ArrayField, BytesField, JsonField, LabelField
from feedpipe.schema.model import Schema

SCHEMA = Schema((BytesField("blob"), ArrayField("mask", "uint8", (None, None)),
                 ArrayField("emb", "float32", (None,)), LabelField("label"), JsonField("meta")))
N = 600


def rows(n: int = N) -> list[dict]:
    """Blobs from empty to ~9 KB, uint8 masks and float32 vectors of varying shapes (empty ones
    too), and JSON with non-ASCII text."""
    rng = np.random.default_rng(3)
    return [{"blob": rng.integers(0, 256, int(rng.choice([0, 3, 40, 700, 9000])),
                                  dtype=np.uint8).tobytes(),
             "mask": rng.integers(0, 256, (i % 5, 3), dtype=np.uint8),
             "emb": rng.normal(size=i % 7).astype(np.float32), "label": i,
             "meta": {"i": i, "name": f"ünï-{i}"}} for i in range(n)]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list[dict]]:
    samples = rows()
    return write_dataset("hdf5", tmp_path_factory.mktemp("h5") / "h5", samples, SCHEMA), \
        samples


def test_every_dataset_is_contiguous_bytes_without_variable_length_types(written):
    root, samples = written
    with h5py.File(root / "data.h5", "r") as f:
        names = set(f)
        for name in names:
            ds = f[name]
            assert ds.dtype.kind in "iuf" and ds.chunks is None and ds.id.get_offset() is not None
        assert len(f["blob"]) == sum(len(s["blob"]) for s in samples)
        offsets = f["blob__offsets"][:]
    assert names == {"blob", "blob__offsets", "mask", "mask__offsets", "mask__shape", "emb",
                     "emb__offsets", "emb__shape", "label", "meta", "meta__offsets", CRC_NAME}
    assert offsets[0] == 0 and (np.diff(offsets) == [len(s["blob"]) for s in samples]).all()


def test_batches_read_back_exactly_as_views_of_the_file(written):
    root, samples = written
    ds = feedpipe.open_dataset(root)
    idx = [599, 0, 256, 255, 17, 17, 512, 3]  # unsorted, duplicated
    for i, got in zip(idx, ds.get_batch(idx), strict=True):
        s = samples[i]
        assert got["blob"] == s["blob"] and got["label"] == i and got["meta"] == s["meta"]
        for name in ("mask", "emb"):
            assert got[name].dtype == s[name].dtype and got[name].shape == s[name].shape
            assert got[name].tobytes() == s[name].tobytes()
    reader = Hdf5Reader(root)
    reader._ensure_open()
    assert all(isinstance(col, np.ndarray) for col in reader._cols[0].values())  # no h5py read


def test_views_outlive_the_reader(written):
    root, samples = written
    reader = Hdf5Reader(root)
    kept: list = []
    reader.visit([5, 400], lambda _, stored: kept.append(stored["blob"]))
    reader.close()
    assert [bytes(k) for k in kept] == [samples[5]["blob"], samples[400]["blob"]]


def test_damaged_offsets_name_the_sample_and_the_rest_reads(tmp_path):
    root = write_dataset("hdf5", tmp_path / "h5", rows(40), SCHEMA)
    with h5py.File(root / "data.h5", "r+") as f:
        f["blob__offsets"][7] = 1 << 40  # past the end of the bytes
    rerecord(root)
    ds = feedpipe.open_dataset(root)
    assert [s["label"] for s in ds.get_batch([0, 5, 30])] == [0, 5, 30]
    for bad in (6, 7):  # the rows whose values end or start there
        with pytest.raises(CorruptRecordError, match=f"key {sample_key(bad)}: .*offsets"):
            ds.get_batch([3, bad])


def test_a_variable_length_hdf5_type_is_refused_before_it_is_read(tmp_path):
    """What the older layout stored (an HDF5 vlen type, kept in a global heap, where libhdf5
    looped forever on a zeroed page) is refused by its dtype, its rows never read."""
    root = write_dataset("hdf5", tmp_path / "h5", rows(8), SCHEMA)
    with h5py.File(root / "data.h5", "r+") as f:
        del f["meta"]
        f.create_dataset("meta", (8,), h5py.string_dtype("utf-8"))[:] = ["{}"] * 8
    rerecord(root)
    with pytest.raises(UnsafeDataError, match="'meta' is stored as object"):
        feedpipe.open_dataset(root)[0]


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_layout_is_refused_with_the_command_that_reconverts(written, tmp_path,
                                                                     version):
    root = tmp_path / "old"
    root.mkdir()
    d = json.loads((written[0] / MANIFEST_NAME).read_text())
    (root / MANIFEST_NAME).write_text(json.dumps({**d, "format_version": version}))
    with pytest.raises(DamagedDataError, match=f"hdf5 format version {version} is no longer read.*"
                                            r"re-convert.*feedpipe convert SRC --to hdf5 -o OUT"):
        feedpipe.open_dataset(root)
