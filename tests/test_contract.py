"""One reader contract, run against every format (the test run's packed photo datasets)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from conftest import FORMATS, N_PHOTOS
from fp_helpers import mean_abs_diff, pil_rgb
from PIL import Image

import feedpipe
from converters import convert
from converters.images import resized_rgb
from converters.pack import PackOptions
from feedpipe.dataset.registry import READERS
from feedpipe.schema.fields import ImageField, JsonField, LabelField


@pytest.fixture
def ds(dataset_path: Path) -> feedpipe.DatasetReader:
    reader = feedpipe.open_dataset(dataset_path)
    yield reader
    reader.close()


def assert_same_sample(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_open_detects_format(ds, fmt):
    assert isinstance(ds, READERS[fmt])
    assert ds.manifest.format == fmt
    assert len(ds) == N_PHOTOS


def test_schema_and_classes(ds, photo_classes):
    assert ds.schema.names == ["image", "label", "path"]
    image = ds.schema["image"]
    assert isinstance(image, ImageField) and image.codec == "jpeg" and image.shape is None
    assert isinstance(ds.schema["label"], LabelField)
    assert isinstance(ds.schema["path"], JsonField)
    assert ds.classes == photo_classes
    assert ds.manifest.num_samples == N_PHOTOS
    assert ds.manifest.conversion["store"] == "passthrough"


def test_getitem_decodes_like_pillow(ds, photos):
    for i, ph in enumerate(photos):
        s = ds[i]
        assert set(s) == {"image", "label", "path"}
        img = s["image"]
        assert isinstance(img, np.ndarray) and img.dtype == np.uint8 and img.ndim == 3
        ref = pil_rgb(ph.path)
        assert img.shape == ref.shape
        assert mean_abs_diff(img, ref) < 1.0, ph.rel
        assert s["label"] == ph.label and type(s["label"]) is int
        assert s["path"] == ph.rel


def test_read_raw_is_the_source_file(ds, photos):
    for i, ph in enumerate(photos):
        raw = ds.read_raw(i)
        assert set(raw) == {"image", "label", "path"}
        assert isinstance(raw["image"], bytes)
        assert raw["image"] == ph.path.read_bytes(), ph.rel  # passthrough: byte-identical
        assert raw["label"] == ph.label and raw["path"] == ph.rel


def test_returned_arrays_are_private_copies(ds):
    a = ds[3]["image"]
    before = a.copy()
    a[...] = 0  # must be writeable and must not write into any read buffer
    assert np.array_equal(ds[3]["image"], before)


def test_get_batch_duplicates_unsorted_negative(ds):
    n = len(ds)
    idx = [5, 3, 5, -1, 0, -n, 47, 3, 20, 19, n - 1]
    batch = ds.get_batch(idx)
    assert len(batch) == len(idx)
    for i, s in zip(idx, batch, strict=True):
        assert_same_sample(s, ds[i % n])
    assert batch[3]["path"] == batch[-1]["path"]  # -1 and n-1 are the same sample
    raw = ds.read_raw_batch(np.array(idx, dtype=np.int64))
    for i, r in zip(idx, raw, strict=True):
        assert_same_sample(r, ds.read_raw(i % n))


def test_get_batch_accepts_ranges_and_numpy(ds):
    by_range = ds.get_batch(range(10, 30))
    by_numpy = ds.get_batch(np.arange(10, 30))
    assert [s["path"] for s in by_range] == [s["path"] for s in by_numpy]
    assert [s["path"] for s in by_range] == [ds[i]["path"] for i in range(10, 30)]


def test_empty_batch(ds):
    assert ds.get_batch([]) == []
    assert ds.read_raw_batch([]) == []


@pytest.mark.parametrize("bad", [N_PHOTOS, N_PHOTOS + 100, -N_PHOTOS - 1])
def test_index_out_of_range(ds, bad):
    with pytest.raises(IndexError):
        ds[bad]
    with pytest.raises(IndexError):
        ds.read_raw(bad)
    with pytest.raises(IndexError):
        ds.get_batch([0, 1, bad])


def test_iteration_matches_random_access(ds, photos):
    seen = list(ds)
    assert len(seen) == N_PHOTOS
    assert [s["path"] for s in seen] == [p.rel for p in photos]
    for i in (0, 21, N_PHOTOS - 1):
        assert_same_sample(seen[i], ds[i])


def test_pickle_before_and_after_open(ds):
    fresh = pickle.loads(pickle.dumps(ds))  # never opened
    assert_same_sample(fresh[7], ds[7])     # ds is now open in this process
    reopened = pickle.loads(pickle.dumps(ds))
    assert len(reopened) == len(ds) and reopened.schema == ds.schema
    assert_same_sample(reopened[-2], ds[-2])
    assert reopened.read_raw(1) == ds.read_raw(1)
    reopened.close()
    fresh.close()


def test_close_then_read_reopens(ds):
    first = ds[4]
    ds.close()
    assert_same_sample(ds[4], first)
    ds.close()
    ds.close()  # idempotent


# --- store="raw": decoded uint8 at a fixed size, read back exactly ---------------------------------

@pytest.fixture(scope="module")
def raw_packed(tmp_path_factory, photo_dir) -> dict:
    root = tmp_path_factory.mktemp("rawpacked")
    out = {}
    for f in FORMATS:
        res = convert(photo_dir, root / f, to=f, workers=0, store="raw", resize=(40, 48))
        assert res.written == N_PHOTOS and res.reencoded == N_PHOTOS
        out[f] = root / f
    return out


def test_store_raw_exact_pixels(raw_packed, fmt, photos):
    ds = feedpipe.open_dataset(raw_packed[fmt])
    field = ds.schema["image"]
    assert field.codec == "raw" and field.shape == (40, 48, 3)
    opts = PackOptions("raw", (40, 48))
    batch = ds.get_batch(range(len(ds)))
    for i, ph in enumerate(photos):
        with Image.open(ph.path) as im:
            im.load()
            ref = resized_rgb(im, opts)
        assert ref.shape == (40, 48, 3)
        got = ds[i]["image"]
        assert got.dtype == np.uint8 and np.array_equal(got, ref), ph.rel
        assert np.array_equal(ds.read_raw(i)["image"], ref)
        assert np.array_equal(batch[i]["image"], ref)


def test_store_raw_shorter_side_is_center_square(tmp_path, photo_dir, photos):
    convert(photo_dir, tmp_path / "sq", to="lmdb", workers=0, store="raw", resize=32)
    ds = feedpipe.open_dataset(tmp_path / "sq")
    assert ds.schema["image"].shape == (32, 32, 3)
    opts = PackOptions("raw", 32)
    for i in (0, 17, N_PHOTOS - 1):
        with Image.open(photos[i].path) as im:
            im.load()
            ref = resized_rgb(im, opts)
        assert np.array_equal(ds[i]["image"], ref)


def test_lmdb_reader_options(packed, photos):
    plain = feedpipe.open_dataset(packed["lmdb"])
    no_readahead = feedpipe.open_dataset(packed["lmdb"], readahead=False)
    for i in (0, 40):
        assert no_readahead.read_raw(i)["image"] == photos[i].path.read_bytes()
        assert plain.read_raw(i) == no_readahead.read_raw(i)
    with pytest.raises(TypeError):
        feedpipe.open_dataset(packed["hdf5"], readahead=False)
