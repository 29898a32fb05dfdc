"""WebDataset specifics: key rules, shard bounds, random access across shards, and compatibility with
the ``webdataset`` library reading our shards unchanged."""

from __future__ import annotations

import io
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import N_PHOTOS, WDS_SHARD_COUNT
from fp_helpers import rerecord
from hypothesis import given, settings
from hypothesis import strategies as st

import feedpipe
from converters.merge import read_part
from feedpipe.dataset.formats.wds import WdsWriter, ustar_header
from feedpipe.dataset.manifest import FileEntry, Manifest
from feedpipe.dataset.registry import sample_key
from feedpipe.errors import ConfigError, CorruptRecordError, DamagedDataError, DataFileMismatchError
from feedpipe.schema.fields import ArrayField, BytesField, JsonField, LabelField
from feedpipe.schema.model import Schema

SCHEMA = Schema((BytesField("blob"), LabelField("label"), ArrayField("vec", "int32", (3,))))


def finish(writer: WdsWriter) -> Path:
    files, extra = writer.close()
    root = writer.root
    Manifest("wds", writer.count, writer.schema, (), tuple(FileEntry.of(root, f) for f in files),
             {}, (), extra).write(root)
    return root


def sample(i: int, size: int = 100) -> dict:
    return {"blob": bytes([i % 256]) * size, "label": i, "vec": np.array([i, -i, 7], np.int32)}


@pytest.mark.parametrize("key", ["a/b", "..", ".", "a.b", "x.jpg", "", "with space", "back\\slash",
                                 "nul\x00"])
def test_writer_rejects_bad_keys(tmp_path, key):
    w = WdsWriter(tmp_path / "k", SCHEMA)
    with pytest.raises(ValueError):
        w.write(sample(0), key=key)
    assert w.count == 0
    w.close()


def test_writer_rejects_bad_prefix_and_bounds(tmp_path):
    with pytest.raises(ValueError):
        WdsWriter(tmp_path / "p", SCHEMA, prefix="my.shards")
    with pytest.raises(ValueError):
        WdsWriter(tmp_path / "q", SCHEMA, shard_count=0)
    with pytest.raises(ValueError):
        WdsWriter(tmp_path / "r", SCHEMA, shard_size=0)


def test_too_long_key_is_rejected_before_any_member_is_written(tmp_path):
    # ustar member names hold 100 bytes: "<92 chars>.cls" fits, "<92 chars>.blob.bin" does not
    schema = Schema((LabelField("label"), BytesField("blob")))
    w = WdsWriter(tmp_path / "long", schema)
    w.write({"label": 1, "blob": b"x"}, key="a")
    with pytest.raises(ValueError):
        w.write({"label": 2, "blob": b"y"}, key="k" * 92)
    w.write({"label": 3, "blob": b"z"}, key="c")
    root = finish(w)
    ds = feedpipe.open_dataset(root)
    assert len(ds) == 2
    streamed = list(ds.iter_shard(0))  # no orphan "kkk….cls" member breaking the grouping
    assert [(k, v["label"]) for k, v in streamed] == [("a", 1), ("c", 3)]
    with tarfile.open(root / "shard-000000.tar") as tar:
        assert tar.getnames() == ["a.cls", "a.blob.bin", "c.cls", "c.blob.bin"]


def test_custom_keys_name_the_members(tmp_path):
    w = WdsWriter(tmp_path / "keys", SCHEMA, prefix="train")
    keys = ["img_001", "IMG-002", "ü_3"]
    for i, k in enumerate(keys):
        w.write(sample(i), key=k)
    root = finish(w)
    assert sorted(p.name for p in root.glob("*.tar")) == ["train-000000.tar"]
    with tarfile.open(root / "train-000000.tar") as tar:
        names = tar.getnames()
    assert names == [f"{k}.{s}" for k in keys for s in ("blob.bin", "cls", "vec.npy")]
    ds = feedpipe.open_dataset(root)
    assert [ds.key_of(i) for i in range(3)] == keys
    assert ds[2]["blob"] == sample(2)["blob"] and ds[2]["label"] == 2


def test_shards_split_by_count(tmp_path):
    w = WdsWriter(tmp_path / "c", SCHEMA, shard_count=7)
    for i in range(30):
        w.write(sample(i))
    root = finish(w)
    ds = feedpipe.open_dataset(root)
    assert ds.shards == [f"shard-{k:06d}.tar" for k in range(5)]
    assert [len(r) for r in ds.shard_ranges()] == [7, 7, 7, 7, 2]
    assert sorted(p.name for p in root.glob("*.tar")) == ds.shards
    # random access in an order that jumps between shards, back and forth
    order = [29, 0, 14, 6, 7, 28, 13, 21, 1, 22, 29]
    for i, s in zip(order, ds.get_batch(order), strict=True):
        assert s["blob"] == sample(i)["blob"] and s["label"] == i
        assert np.array_equal(s["vec"], sample(i)["vec"])
    for shard, rng in enumerate(ds.shard_ranges()):
        streamed = list(ds.iter_shard(shard))
        assert [k for k, _ in streamed] == [sample_key(i) for i in rng]
        assert [v["label"] for _, v in streamed] == list(rng)


def test_shards_split_by_size(tmp_path):
    limit = 20_000
    w = WdsWriter(tmp_path / "s", SCHEMA, shard_size=limit)
    for i in range(40):
        w.write(sample(i, size=3000))
    root = finish(w)
    ds = feedpipe.open_dataset(root)
    assert len(ds.shards) >= 6
    assert sum(len(r) for r in ds.shard_ranges()) == 40
    for name in ds.shards:
        # members stay within the bound; tarfile pads the closed archive to a 10 KiB record
        assert (root / name).stat().st_size <= limit + 10240
    for i in (39, 0, 20, 5):
        assert ds[i]["blob"] == sample(i, size=3000)["blob"]


def test_oversized_sample_gets_its_own_shard(tmp_path):
    w = WdsWriter(tmp_path / "o", SCHEMA, shard_size=1)
    for i in range(3):
        w.write(sample(i, size=5000))
    root = finish(w)
    ds = feedpipe.open_dataset(root)
    assert len(ds.shards) == 3
    assert [ds[i]["blob"] for i in range(3)] == [sample(i, size=5000)["blob"] for i in range(3)]


def test_session_dataset_spans_shards(packed):
    ds = feedpipe.open_dataset(packed["wds"])
    assert len(ds.shards) == -(-N_PHOTOS // WDS_SHARD_COUNT)
    assert [r.start for r in ds.shard_ranges()] == list(range(0, N_PHOTOS, WDS_SHARD_COUNT))


def test_webdataset_library_reads_our_shards(packed, photos):
    import webdataset

    root = packed["wds"]
    ds = feedpipe.open_dataset(root)
    urls = [str(root / s) for s in ds.shards]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = list(webdataset.WebDataset(urls, shardshuffle=False))
    assert len(got) == N_PHOTOS
    for i, (s, ph) in enumerate(zip(got, photos, strict=True)):
        # format version 3: the source path lives in the index, not in the shards
        assert set(s) - {"__url__", "__local_path__"} == {"__key__", "jpg", "cls"}
        assert s["__key__"] == ds.key_of(i) == sample_key(i)
        assert s["jpg"] == ph.path.read_bytes() == ds.read_raw(i)["image"]
        assert s["cls"] == str(ph.label).encode()
        assert ds[i]["path"] == ph.rel


@settings(max_examples=200, deadline=None)
@given(name=st.text(min_size=1, max_size=60).filter(lambda s: "\x00" not in s),
       size=st.integers(0, 8 ** 11 - 1))
def test_ustar_header_is_byte_for_byte_what_tarfile_writes(name, size):
    if len(name.encode(tarfile.ENCODING, "surrogateescape")) > 100:
        # refused by name (tarfile may instead split it at a "/" into ustar's prefix field)
        with pytest.raises(ConfigError, match="name is too long"):
            ustar_header(name, size)
        return
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o444, 0
    assert ustar_header(name, size) == info.tobuf(tarfile.USTAR_FORMAT)


def test_shards_are_byte_for_byte_what_tarfile_writes(tmp_path):
    # the writer builds ustar blocks itself (for speed); the shards must stay plain tar files
    # identical to tarfile's, end-of-archive record padding included
    w = WdsWriter(tmp_path / "w", SCHEMA, shard_count=7)
    for i in range(10):
        w.write(sample(i, size=i * 97))
    finish(w)
    members = []
    for shard in ("shard-000000.tar", "shard-000001.tar"):
        with tarfile.open(tmp_path / "w" / shard) as tar:
            members.append([(m.name, tar.extractfile(m).read()) for m in tar])
        ref = tmp_path / f"ref-{shard}"
        with tarfile.open(ref, "w", format=tarfile.USTAR_FORMAT) as tar:
            for name, data in members[-1]:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o444, 0
                tar.addfile(info, io.BytesIO(data))
        assert (tmp_path / "w" / shard).read_bytes() == ref.read_bytes()
    assert [len(m) for m in members] == [7 * 3, 3 * 3]


def test_path_lives_in_the_index_and_reads_as_before(packed, photos):
    root = packed["wds"]
    ds = feedpipe.open_dataset(root)
    assert ds.manifest.format_version == 3 and ds.manifest.extra["index_fields"] == ["path"]
    assert "index-values.npy" in {f.name for f in ds.manifest.files}
    with tarfile.open(root / ds.shards[0]) as tar:
        assert tar.getnames()[:4] == [f"{sample_key(0)}.jpg", f"{sample_key(0)}.cls",
                                      f"{sample_key(1)}.jpg", f"{sample_key(1)}.cls"]
    want = [ph.rel for ph in photos]
    assert [ds[i]["path"] for i in range(len(ds))] == want  # random access
    assert [v["path"] for s in range(len(ds.shards)) for _, v in ds.iter_shard(s)] == want
    got = feedpipe.make_loader(root, 16, size=32, device="cpu", num_workers=0, shuffle=False,
                               fields=["label", "path"])
    assert [p for b in got for p in b["path"]] == want


@pytest.mark.parametrize("version", [1, 2])
def test_a_webdataset_written_before_0_1_is_refused_to_reconvert(tmp_path, packed, version):
    """Every field a tar member (no index fields) still reads at format version 3; the same
    files marked version 1 or 2 (written before release 0.1) are refused by a DamagedDataError that
    says to re-convert, when opened and when merged as a part (they used to read through their
    own branches)."""
    ref = feedpipe.open_dataset(packed["wds"])
    w = WdsWriter(tmp_path / "old", ref.schema, shard_count=WDS_SHARD_COUNT, index_fields=())
    for s in ref.read_raw_batch(range(len(ref))):
        w.write(s)
    files, extra = w.close()
    assert "index_fields" not in extra and "index-values.npy" not in files
    with tarfile.open(w.root / "shard-000000.tar") as tar:
        assert f"{sample_key(0)}.path.json" in tar.getnames()

    def manifest(version: int) -> Manifest:
        return Manifest("wds", w.count, ref.schema, ref.classes,
                        tuple(FileEntry.of(w.root, f) for f in files), {}, (), extra,
                        format_version=version)

    manifest(3).write(w.root)
    ds = feedpipe.open_dataset(w.root)
    assert [ds[i]["path"] for i in range(len(ds))] == [ref[i]["path"] for i in range(len(ref))]
    manifest(version).write(w.root)
    refusal = f"wds format version {version} is no longer read.*re-convert the dataset"
    with pytest.raises(DamagedDataError, match=refusal):
        feedpipe.open_dataset(w.root)
    with pytest.raises(DamagedDataError, match=refusal):
        feedpipe.make_loader(w.root, 8, size=32, num_workers=0)
    with pytest.raises(DamagedDataError, match=refusal):
        read_part(w.root)


def test_damaged_packed_values_are_refused(tmp_path):
    schema = Schema((LabelField("label"), JsonField("path")))
    w = WdsWriter(tmp_path / "d", schema)
    for i in range(3):
        w.write({"label": i, "path": f"dir/{i}.jpg"})
    root = finish(w)
    assert [feedpipe.open_dataset(root)[i]["path"] for i in range(3)] == \
        [f"dir/{i}.jpg" for i in range(3)]
    values = np.load(root / "index-values.npy")
    values[1] ^= 1  # one flipped bit in sample 0's path
    np.save(root / "index-values.npy", values)
    ds = feedpipe.open_dataset(root)
    with pytest.raises(CorruptRecordError, match="checksum"):
        ds[0]
    assert ds[1]["path"] == "dir/1.jpg"
    np.save(root / "index-values.npy", values[:-5])  # cut short: its size says so at open
    with pytest.raises(DataFileMismatchError, match="index-values.npy"):
        feedpipe.open_dataset(root)
    rerecord(root)  # a manifest forged to match: the spans point past its end
    with pytest.raises(CorruptRecordError, match="outside"):
        feedpipe.open_dataset(root)


def test_only_json_fields_go_in_the_index(tmp_path):
    with pytest.raises(ValueError, match="only JSON fields"):
        WdsWriter(tmp_path / "x", SCHEMA, index_fields=("blob",))
