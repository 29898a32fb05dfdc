"""Writer-level round trips: every field kind through every format's writer and reader, exactly."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import feedpipe
from feedpipe.dataset.formats.lmdb import LmdbWriter
from feedpipe.dataset.manifest import FileEntry, Manifest
from feedpipe.dataset.registry import WRITERS
from feedpipe.dataset.verify import verify
from feedpipe.errors import SampleError, UnsafeDataError
from feedpipe.schema.fields import ArrayField, BytesField, ImageField, JsonField, LabelField
from feedpipe.schema.model import Schema

SCHEMA = Schema((
    ImageField("image", "raw", (12, 16, 3)),        # raw, fixed shape
    ImageField("thumb", "raw"),                     # raw, variable shape
    ImageField("photo", "png"),                     # encoded
    LabelField("label"),
    ArrayField("vec", "float32", (5,)),             # fixed
    ArrayField("mask", "uint8", (None, None)),      # variable shape, fixed rank
    ArrayField("anyarr", "int64"),                  # any shape, any rank (0-d included)
    ArrayField("score", "float64", ()),             # fixed scalar
    BytesField("blob"),
    JsonField("meta"),
))
CLASSES = ("cat", "dog", "émeu")
N = 23


def make_samples(n: int = N, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        th, tw = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        photo = rng.integers(0, 256, (int(rng.integers(2, 10)), int(rng.integers(2, 10)), 3),
                             dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(photo).save(buf, "PNG")
        rank = i % 4
        out.append({
            "image": rng.integers(0, 256, (12, 16, 3), dtype=np.uint8),
            "thumb": rng.integers(0, 256, (th, tw, 3), dtype=np.uint8),
            "photo": buf.getvalue(),
            "_photo_pixels": photo,
            "label": int(rng.integers(-1, 3)) if i else 2**40,
            "vec": np.array([np.nan, -0.0, np.inf, 1e-38, i], dtype=np.float32),
            "mask": rng.integers(0, 256, (i % 3, 4), dtype=np.uint8),   # includes 0-row masks
            "anyarr": rng.integers(-2**62, 2**62, tuple(range(2, 2 + rank)), dtype=np.int64),
            "score": np.array(i / 3 - 1.0),
            "blob": bytes(rng.integers(0, 256, i * 7, dtype=np.uint8)),   # includes b""
            "meta": {"i": i, "name": f"sample ü {i}", "tags": ["a", None, True, 1.5],
                     "nested": {"x": [[]]}},
        })
    return out


def write_dataset(fmt: str, root: Path, samples: list[dict], schema: Schema = SCHEMA,
                  **options) -> Path:
    """Write samples with WRITERS[fmt] and a manifest, the way converters/pack.py does."""
    writer = WRITERS[fmt](root, schema, **options)
    for s in samples:
        writer.write({f.name: s[f.name] for f in schema})
    files, extra = writer.close()
    Manifest(fmt, writer.count, schema, CLASSES, tuple(FileEntry.of(root, f) for f in files),
             {"source": "test_writers"}, (), extra).write(root)
    return root


def assert_exact(a, b, what):
    if isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray), what
        assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, a.shape, b.shape)
        assert a.tobytes() == b.tobytes(), what  # bitwise: NaN, -0.0 included
    else:
        assert type(a) is type(b) and a == b, what


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    return make_samples()


@pytest.fixture(scope="module")
def written(tmp_path_factory, samples) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("writers")
    return {f: write_dataset(f, root / f, samples, **({"shard_count": 5} if f == "wds" else {}))
            for f in WRITERS}


def test_manifest_round_trip(written, fmt):
    ds = feedpipe.open_dataset(written[fmt])
    assert len(ds) == N
    assert ds.schema == SCHEMA
    assert ds.classes == CLASSES
    assert ds.manifest.conversion == {"source": "test_writers"}
    names = [f.name for f in ds.manifest.files]
    expected = {"lmdb": ["data.mdb"], "hdf5": ["data.h5"],
                "wds": [f"shard-{k:06d}.tar" for k in range(5)]
                + ["index-offsets.npy", "index-shards.npy", "index-keys.npy",
                   "index-crc32.npy"]}[fmt]
    assert names == expected
    for f in ds.manifest.files:
        assert (written[fmt] / f.name).stat().st_size == f.size
    assert not (written[fmt] / "lock.mdb").exists()  # readers open lock-free


def test_read_back_exactly(written, fmt, samples):
    ds = feedpipe.open_dataset(written[fmt])
    for i, s in enumerate(samples):
        got = ds[i]
        assert set(got) == set(SCHEMA.names)
        for name in ("image", "thumb", "vec", "mask", "anyarr", "score", "blob", "meta", "label"):
            assert_exact(got[name], s[name], f"{fmt} #{i} {name}")
        assert_exact(got["photo"], s["_photo_pixels"], f"{fmt} #{i} photo")  # PNG: lossless
        raw = ds.read_raw(i)
        assert_exact(raw["photo"], s["photo"], f"{fmt} #{i} photo bytes")
        assert_exact(raw["image"], s["image"], f"{fmt} #{i} raw image")


def test_batch_and_iteration_agree(written, fmt, samples):
    ds = feedpipe.open_dataset(written[fmt])
    idx = [22, 0, 7, 7, -3, 11, 5, 1]
    for i, got in zip(idx, ds.get_batch(idx), strict=True):
        for name in ("thumb", "mask", "anyarr", "score", "blob", "meta"):
            assert_exact(got[name], samples[i][name], f"{fmt} batch #{i} {name}")
    for i, got in enumerate(ds):
        assert_exact(got["anyarr"], samples[i]["anyarr"], f"{fmt} iter #{i}")


def test_written_dataset_verifies(written, fmt):
    report = verify(written[fmt])
    assert report.ok, report.problems
    assert report.records_checked == N


def test_empty_dataset(tmp_path, fmt):
    root = write_dataset(fmt, tmp_path / fmt, [])
    ds = feedpipe.open_dataset(root)
    assert len(ds) == 0
    assert list(ds) == [] and ds.get_batch([]) == []
    with pytest.raises(IndexError):
        ds[0]
    assert verify(root).ok


@pytest.mark.parametrize("compression", ["lzf", "gzip"])
def test_hdf5_compression_round_trip(tmp_path, samples, compression):
    root = write_dataset("hdf5", tmp_path / compression, samples[:9], compression=compression)
    ds = feedpipe.open_dataset(root)
    assert ds.manifest.extra["compression"] == compression
    for i in range(9):
        assert_exact(ds[i]["image"], samples[i]["image"], f"{compression} #{i}")
        assert_exact(ds[i]["vec"], samples[i]["vec"], f"{compression} #{i}")


def test_hdf5_rejects_unknown_compression(tmp_path):
    with pytest.raises(ValueError, match="compression"):
        WRITERS["hdf5"](tmp_path / "h", SCHEMA, compression="zstd")


BAD_VALUES = [
    ("image", np.zeros((12, 15, 3), np.uint8), ValueError),      # wrong fixed shape
    ("image", np.zeros((12, 16, 3), np.float32), ValueError),    # wrong dtype
    ("thumb", np.zeros((4, 4), np.uint8), ValueError),           # not H×W×3
    ("photo", np.zeros((4, 4, 3), np.uint8), TypeError),         # encoded image needs bytes
    ("label", True, TypeError),
    ("label", "3", TypeError),
    ("vec", np.zeros(4, np.float32), ValueError),
    ("mask", np.zeros((2, 2, 2), np.uint8), ValueError),         # wrong rank
    ("anyarr", np.zeros(3, np.float64), TypeError),              # float does not fit int64
    ("anyarr", np.array([1, "x"], dtype=object), UnsafeDataError),
    ("blob", "text", TypeError),
    ("meta", {"x": object()}, TypeError),
    ("meta", float("nan"), TypeError),
]


@pytest.mark.parametrize("name,value,exc", BAD_VALUES,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD_VALUES)])
def test_writer_rejects_bad_values_and_stays_consistent(tmp_path, fmt, samples, name, value, exc):
    root = tmp_path / fmt
    writer = WRITERS[fmt](root, SCHEMA)
    good = [{f.name: s[f.name] for f in SCHEMA} for s in samples[:2]]
    writer.write(good[0])
    with pytest.raises(exc):
        writer.write({**good[1], name: value})
    assert writer.count == 1
    writer.write(good[1])
    files, extra = writer.close()
    Manifest(fmt, writer.count, SCHEMA, (), tuple(FileEntry.of(root, f) for f in files),
             {}, (), extra).write(root)
    ds = feedpipe.open_dataset(root)
    assert len(ds) == 2
    assert_exact(ds[1]["anyarr"], samples[1]["anyarr"], "after a rejected write")
    assert ds[1]["meta"] == samples[1]["meta"]


def test_writer_requires_every_field(tmp_path, fmt, samples):
    writer = WRITERS[fmt](tmp_path / fmt, SCHEMA)
    sample = {f.name: samples[0][f.name] for f in SCHEMA}
    del sample["blob"]
    with pytest.raises(SampleError, match="blob"):  # bad input, a ValueError
        writer.write(sample)
    writer.close()


def test_lmdb_writer_grows_map_size(tmp_path):
    schema = Schema((BytesField("blob"), LabelField("label")))
    rng = np.random.default_rng(1)
    # 2100 records × ~2 KB = ~4 MB into a 64 KiB map: two flushes (2048 records, then close)
    blobs = [bytes(rng.integers(0, 256, 1900 + i % 200, dtype=np.uint8)) for i in range(2100)]
    root = tmp_path / "grow"
    writer = LmdbWriter(root, schema, map_size=64 << 10)
    for i, b in enumerate(blobs):
        writer.write({"blob": b, "label": i})
    files, extra = writer.close()
    Manifest("lmdb", writer.count, schema, (), tuple(FileEntry.of(root, f) for f in files),
             {}, (), extra).write(root)
    assert (root / "data.mdb").stat().st_size > 4 << 20
    ds = feedpipe.open_dataset(root)
    assert len(ds) == 2100 and ds.num_entries() == 2100
    got = ds.get_batch(range(2100))
    assert all(g["blob"] == b and g["label"] == i for i, (g, b) in enumerate(zip(got, blobs, strict=True)))


def test_lmdb_writer_grows_for_one_huge_record(tmp_path):
    schema = Schema((BytesField("blob"),))
    big = bytes(range(256)) * (12 << 12)  # 12 MiB in one value, map starts at 64 KiB
    root = tmp_path / "huge"
    writer = LmdbWriter(root, schema, map_size=64 << 10)
    writer.write({"blob": big})
    files, extra = writer.close()
    Manifest("lmdb", 1, schema, (), tuple(FileEntry.of(root, f) for f in files), {}, (),
             extra).write(root)
    assert feedpipe.open_dataset(root)[0]["blob"] == big


def test_equal_length_variable_rows_in_one_block(tmp_path, fmt):
    # the HDF5 writer stores a block of variable-length rows in one call: rows that happen to
    # have the same length (and rank) must stay separate rows, not become one 2-D array
    schema = Schema((BytesField("blob"), ArrayField("mask", "uint8", (None, None))))
    rows = [{"blob": bytes([i % 256]) * 5, "mask": np.full((2, 3), i % 256, np.uint8)}
            for i in range(300)]
    ds = feedpipe.open_dataset(write_dataset(fmt, tmp_path / fmt, rows, schema))
    assert len(ds) == 300
    for i in (0, 255, 256, 299):
        assert ds[i]["blob"] == bytes([i % 256]) * 5
        assert_exact(ds[i]["mask"], np.full((2, 3), i % 256, np.uint8), i)
    assert verify(tmp_path / fmt).ok
