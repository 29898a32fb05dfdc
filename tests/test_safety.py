"""No pickle, anywhere: datasets carrying pickle payloads or object arrays are refused unexecuted."""

from __future__ import annotations

import io
import json
import pathlib
import zlib

import lmdb
import numpy as np
import pytest
from fp_helpers import rerecord

import feedpipe
from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry, Manifest
from feedpipe.dataset.registry import WRITERS, sample_key
from feedpipe.dataset.verify import verify
from feedpipe.errors import FeedpipeError, UnsafeDataError
from feedpipe.schema.codecs import pack_record
from feedpipe.schema.fields import ArrayField, LabelField
from feedpipe.schema.model import Schema

SCHEMA = Schema((ArrayField("arr", "float32", (256,)), LabelField("label")))
N = 4


class Armed:
    """Unpickling this creates ``marker``: proof that stored data was executed."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def armed_npy(marker: pathlib.Path, size: int | None = None) -> bytes:
    """An object-dtype npy payload whose pickle creates ``marker``; zero-padded to ``size``."""
    buf = io.BytesIO()
    np.save(buf, np.array([Armed(marker)], dtype=object), allow_pickle=True)
    data = buf.getvalue()
    if size is not None:
        assert len(data) <= size
        data += b"\x00" * (size - len(data))  # pickle stops at its STOP opcode
    return data


def test_the_payload_is_really_armed(tmp_path):
    # guard for the tests below: an unsafe loader *would* run it, even with the padding
    marker = tmp_path / "ran"
    np.load(io.BytesIO(armed_npy(marker, 4096)), allow_pickle=True)
    assert marker.exists()


def value(i: int) -> dict:
    return {"arr": np.full(256, i, np.float32), "label": i}


def write(fmt: str, root: pathlib.Path) -> pathlib.Path:
    w = WRITERS[fmt](root, SCHEMA)
    for i in range(N):
        w.write(value(i))
    files, extra = w.close()
    Manifest(fmt, w.count, SCHEMA, (), tuple(FileEntry.of(root, f) for f in files), {}, (),
             extra).write(root)
    return root


def assert_refused(root: pathlib.Path, bad: int, marker: pathlib.Path) -> None:
    ds = feedpipe.open_dataset(root)
    with pytest.raises(UnsafeDataError, match="object"):
        ds[bad]
    with pytest.raises(UnsafeDataError):
        ds.read_raw(bad)
    with pytest.raises(UnsafeDataError):
        ds.get_batch([0, bad])
    with pytest.raises(UnsafeDataError):
        list(ds)
    good = next(i for i in range(N) if i != bad)
    assert ds[good]["label"] == good  # the rest of the dataset is still readable
    report = verify(root)
    assert not report.ok and any(sample_key(bad) in p for p in report.problems)
    assert not marker.exists()


def test_lmdb_pickle_payload_refused(tmp_path):
    root = write("lmdb", tmp_path / "ds")
    marker = tmp_path / "ran"
    env = lmdb.open(str(root), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(sample_key(2).encode(), pack_record([armed_npy(marker), b"2"]))
    env.close()
    rerecord(root)  # a forger fixes the manifest's size up as well
    assert_refused(root, 2, marker)


def test_wds_pickle_payload_refused(tmp_path):
    root = write("wds", tmp_path / "ds")
    marker = tmp_path / "ran"
    ds = feedpipe.open_dataset(root)
    off, size = (int(x) for x in ds._offsets[1][0])  # member 000000001.arr.npy
    shard = root / ds.shards[0]
    with open(shard, "r+b") as fh:  # replace the member's content in place, same size
        fh.seek(off)
        assert np.load(io.BytesIO(fh.read(size)), allow_pickle=False)[0] == 1.0
        fh.seek(off)
        fh.write(armed_npy(marker, size))
    crcs = np.load(root / "index-crc32.npy")  # a forger fixes the checksum up as well
    crcs[1, 0] = zlib.crc32(armed_npy(marker, size))
    np.save(root / "index-crc32.npy", crcs)
    assert_refused(root, 1, marker)
    with pytest.raises(UnsafeDataError):  # the sequential stream refuses it too
        list(ds.iter_shard(0))
    assert not marker.exists()


def test_hdf5_cannot_hold_an_object_array(tmp_path):
    w = WRITERS["hdf5"](tmp_path / "h", SCHEMA)
    with pytest.raises(UnsafeDataError):
        w.write({"arr": np.array([Armed(tmp_path / "ran")] * 256, dtype=object), "label": 0})
    w.close()
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_object_arrays_refused_at_write_time(tmp_path, fmt):
    marker = tmp_path / "ran"
    w = WRITERS[fmt](tmp_path / fmt, SCHEMA)
    for bad in (np.array([Armed(marker)] * 256, dtype=object),
                np.array([1.0] * 256, dtype=object)):
        with pytest.raises(UnsafeDataError):
            w.write({"arr": bad, "label": 0})
    assert w.count == 0
    w.close()
    with pytest.raises(UnsafeDataError):
        ArrayField("x", "O")
    with pytest.raises(UnsafeDataError):
        Schema((ArrayField("x", np.dtype([("a", "i4"), ("b", "O")])),))
    assert not marker.exists()


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_manifest_declaring_object_dtype_refused(tmp_path, fmt):
    root = write(fmt, tmp_path / "ds")
    d = json.loads((root / MANIFEST_NAME).read_text())
    d["schema"][0]["dtype"] = "|O"
    (root / MANIFEST_NAME).write_text(json.dumps(d))
    with pytest.raises((UnsafeDataError, feedpipe.DamagedDataError)):
        feedpipe.open_dataset(root)


def test_wds_index_with_pickle_refused(tmp_path):
    root = write("wds", tmp_path / "ds")
    marker = tmp_path / "ran"
    (root / "index-offsets.npy").write_bytes(armed_npy(marker))
    with pytest.raises((FeedpipeError, ValueError)):
        feedpipe.open_dataset(root)
    assert not marker.exists()


def test_plain_pickle_instead_of_npy_is_corrupt_not_run(tmp_path):
    import pickle

    root = write("lmdb", tmp_path / "ds")
    marker = tmp_path / "ran"
    env = lmdb.open(str(root), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(sample_key(0).encode(), pack_record([pickle.dumps(Armed(marker)), b"0"]))
    env.close()
    rerecord(root)
    with pytest.raises(feedpipe.CorruptRecordError, match="npy"):
        feedpipe.open_dataset(root)[0]
    assert not marker.exists()


def test_no_pickle_in_the_package():
    root = pathlib.Path(feedpipe.__file__).parent
    sources = [*root.rglob("*.py"), *(root.parent / "converters").rglob("*.py")]
    assert sources
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for needle in ("import pickle", "from pickle", "allow_pickle=True", "import marshal",
                       "import dill", "import cloudpickle"):
            assert needle not in text, (path, needle)


def armed_pickle(marker: pathlib.Path) -> bytes:
    """A plain pickle whose loading creates ``marker`` (what a ``.pickle`` member would hold)."""
    import pickle

    data = pickle.dumps(Armed(marker))
    pickle.loads(data)  # guard: it really is armed...
    assert marker.exists()
    marker.unlink()  # ...and from here on it must never run again
    return data


@pytest.mark.parametrize("suffix", ["pickle", "pkl", "pyd", "pth", "arr.pickle"])
def test_wds_pickle_members_refused(tmp_path, suffix):
    import tarfile

    root = write("wds", tmp_path / "ds")
    marker = tmp_path / "ran"
    data = armed_pickle(marker)
    ds = feedpipe.open_dataset(root)
    with tarfile.open(root / ds.shards[0], "a", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo(f"{sample_key(N - 1)}.{suffix}")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UnsafeDataError, match=rf"{sample_key(N - 1)}\.{suffix}"):
        list(feedpipe.open_dataset(root).iter_shard(0))
    report = verify(root)
    assert any(f".{suffix}" in p and "unpickling" in p for p in report.problems)
    assert [s["label"] for s in feedpipe.open_dataset(root)] == list(range(N))  # index reads
    assert not marker.exists()


def test_lmdb_stray_pickle_entry_reported_never_read(tmp_path):
    root = write("lmdb", tmp_path / "ds")
    marker = tmp_path / "ran"
    env = lmdb.open(str(root), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"000000001.pickle", armed_pickle(marker))
    env.close()
    rerecord(root)
    report = verify(root)
    assert any("000000001.pickle" in p and "pickle" in p for p in report.problems)
    assert [s["label"] for s in feedpipe.open_dataset(root)] == list(range(N))
    assert not marker.exists()


def test_hdf5_object_dataset_and_pickle_dataset_refused(tmp_path):
    import h5py

    root = write("hdf5", tmp_path / "ds")
    marker = tmp_path / "ran"
    data = armed_pickle(marker)
    with h5py.File(root / "data.h5", "r+") as f:
        f.create_dataset("payload.pickle", data=np.frombuffer(data, np.uint8))
    rerecord(root)
    report = verify(root)
    assert any("payload.pickle" in p and "pickle" in p for p in report.problems)
    assert feedpipe.open_dataset(root)[1]["label"] == 1
    with h5py.File(root / "data.h5", "r+") as f:  # the array field now holds Python objects
        del f["arr"]
        f.create_dataset("arr", data=np.array([np.void(data)] * N))  # opaque pickle bytes
    rerecord(root)
    with pytest.raises(UnsafeDataError, match="'arr'"):
        feedpipe.open_dataset(root)[0]
    report = verify(root)
    assert any("'arr'" in p for p in report.problems)
    assert not marker.exists()
