"""A data file belongs to its manifest: another dataset's ``data.mdb``, ``data.h5`` or shard of
the same schema and count, copied in, is refused when it is opened (its size; for LMDB and HDF5
also the dataset id written into it at conversion), naming the file, by the loader under either
``on_error`` as well as by ``verify``. The id is a digest of the records, so conversions stay
byte-reproducible."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import lmdb
import pytest
from conftest import N_PHOTOS, PHOTO_SIZE, WDS_SHARD_COUNT

import feedpipe
from converters import convert
from converters.merge import merge
from converters.parts import Part
from converters.synth import make_photos
from feedpipe import Workers
from feedpipe.dataset.formats.lmdb import ID_KEY
from feedpipe.dataset.manifest import MANIFEST_NAME
from feedpipe.dataset.verify import verify
from feedpipe.errors import CorruptRecordError, DataFileMismatchError

DATA = {"lmdb": "data.mdb", "hdf5": "data.h5"}
KW = dict(size=32, device="cpu", num_workers=0, shuffle=False, fields=("image", "label"))


@pytest.fixture(scope="module")
def others(tmp_path_factory) -> dict[str, Path]:
    """Other photos, the same count and classes, converted like the test run's ``packed``."""
    root = tmp_path_factory.mktemp("others")
    src = make_photos(root / "src", N_PHOTOS, size=PHOTO_SIZE, classes=4, seed=1)
    return {fmt: convert(src, root / fmt, to=fmt, workers=0, writer_options={
        "shard_count": WDS_SHARD_COUNT} if fmt == "wds" else None).out for fmt in
        ("lmdb", "hdf5", "wds")}


def manifest(root: Path) -> dict:
    return json.loads((root / MANIFEST_NAME).read_text())


def refused_everywhere(root: Path, name: str, match: str) -> None:
    """Opening names ``name``; the loader under either on_error and verify do too."""
    with pytest.raises(DataFileMismatchError, match=match) as exc:
        feedpipe.open_dataset(root)[0]
    assert exc.value.file == root / name
    for on_error in ("raise", "skip"):
        with pytest.raises(DataFileMismatchError, match=name):
            next(iter(feedpipe.make_loader(root, 8, workers=Workers(on_error=on_error), **KW)))
    assert any(name in p and "dataset" in p for p in verify(root).problems)


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_another_datasets_data_file_is_refused_at_open(fmt, packed, others, copy_dataset):
    root = copy_dataset(packed[fmt])
    shutil.copyfile(others[fmt] / DATA[fmt], root / DATA[fmt])
    refused_everywhere(root, DATA[fmt], "bytes, its manifest says|dataset id")


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_the_same_size_is_caught_by_the_dataset_id(fmt, packed, others, copy_dataset):
    """Sizes may agree (LMDB's grow by 4 KiB pages): the embedded id still tells them apart."""
    root = copy_dataset(packed[fmt])
    shutil.copyfile(others[fmt] / DATA[fmt], root / DATA[fmt])
    d = manifest(root)
    d["files"][0]["size"] = (root / DATA[fmt]).stat().st_size  # as if the sizes were equal
    (root / MANIFEST_NAME).write_text(json.dumps(d))
    mine, theirs = d["extra"]["dataset_id"], manifest(others[fmt])["extra"]["dataset_id"]
    assert mine != theirs
    refused_everywhere(root, DATA[fmt], f"holds dataset id {theirs}, its manifest records "
                                        f"{mine}")


def test_the_id_is_in_the_file_and_the_conversion_stays_reproducible(packed, photo_dir,
                                                                       tmp_path):
    again = convert(photo_dir, tmp_path / "again", to="lmdb", workers=0).out
    assert (again / "data.mdb").read_bytes() == (packed["lmdb"] / "data.mdb").read_bytes()
    ids = {fmt: manifest(packed[fmt])["extra"]["dataset_id"] for fmt in DATA}
    copy = tmp_path / "copy"  # a reader of packed["lmdb"] may live: py-lmdb opens a file once
    shutil.copytree(packed["lmdb"], copy)
    env = lmdb.open(str(copy), readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(ID_KEY) == ids["lmdb"].encode()
    env.close()
    with h5py.File(packed["hdf5"] / "data.h5", "r") as f:
        assert f.attrs["dataset_id"] == ids["hdf5"].encode()
    ds = feedpipe.open_dataset(packed["lmdb"])
    assert ds.num_entries() == len(ds) and not ds.stray_entries()  # the id is no record


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_dataset_converted_before_the_id_still_reads(fmt, packed, copy_dataset):
    root = copy_dataset(packed[fmt])
    d = manifest(root)
    del d["extra"]["dataset_id"]
    (root / MANIFEST_NAME).write_text(json.dumps(d))
    assert len(list(feedpipe.make_loader(root, 8, **KW))) == N_PHOTOS // 8


def test_another_datasets_shard_is_refused_sample_by_sample(packed, others, copy_dataset):
    """WebDataset shards are read one by one: a foreign one is lost like a damaged one, named
    by shard and key (the index's offsets and crc32s bind the tars: no id needed)."""
    root = copy_dataset(packed["wds"])
    shard = "shard-000001.tar"
    shutil.copyfile(others["wds"] / shard, root / shard)
    with pytest.raises(CorruptRecordError, match=f"key 000000020: .*{shard}: .*bytes, its "
                                                 "manifest says"):
        list(feedpipe.make_loader(root, 8, **KW))
    ds = feedpipe.open_dataset(root)
    assert ds[0]["label"] == feedpipe.open_dataset(packed["wds"])[0]["label"]  # shard 0 reads
    problems = verify(root).problems
    assert sum(shard in p and "its manifest says" in p for p in problems) >= 20


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_merged_datasets_parts_are_bound_too(fmt, photo_dir, tmp_path):
    out = tmp_path / "merged"
    for i in range(2):
        convert(photo_dir, out, to=fmt, workers=0, part=Part(i, 2))
    merge(out)
    parts = manifest(out)["extra"]["parts"]
    assert all(len(p["dataset_id"]) == 32 for p in parts)
    first, second = (out / p["dir"] / DATA[fmt] for p in parts)
    shutil.copyfile(second, first)  # part 1's file in part 0's place
    d = manifest(out)
    name = f"{parts[0]['dir']}/{DATA[fmt]}"
    for f in d["files"]:
        if f["name"] == name:
            f["size"] = first.stat().st_size
    (out / MANIFEST_NAME).write_text(json.dumps(d))
    with pytest.raises(DataFileMismatchError, match=f"{name}: holds dataset id"):
        feedpipe.open_dataset(out)[0]
