"""Arrays without images packed as datasets (converters.arrays, converters.tables): from a dict
of arrays or an iterable of samples, to every format, dtypes kept; atomic; typed errors; missing
values reported; `feedpipe convert` on .npy/.npz/CSV/JSONL/Parquet tables with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import cli_main

import feedpipe
from converters.arrays import pack_arrays
from feedpipe.dataset.verify import verify
from feedpipe.errors import BadInputError, ConfigError

FORMATS = ("lmdb", "hdf5", "wds")
N = 40


def _arrays(n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"x": rng.standard_normal((n, 5, 3)).astype(np.float32),
            "y": rng.integers(-9, 9, n).astype(np.int16),
            "half": rng.standard_normal((n, 2)).astype(np.float16),
            "flag": rng.random(n) > 0.5,
            "code": rng.integers(0, 255, (n, 4), dtype=np.uint8),
            "label": np.arange(n, dtype=np.int64)}


def _same(ds, data: dict[str, np.ndarray]) -> None:
    assert len(ds) == len(next(iter(data.values())))
    for k, s in enumerate(ds):
        for name, a in data.items():
            got = s[name]
            assert got.dtype == a.dtype and got.shape == a[k].shape, name
            assert np.array_equal(got, a[k], equal_nan=True), (name, k)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dict_of_arrays_round_trips_with_dtypes_kept(tmp_path, fmt):
    data = _arrays()
    res = pack_arrays(data, tmp_path / "out", to=fmt)
    assert res.written == N and not res.skipped and not res.missing
    ds = feedpipe.open_dataset(tmp_path / "out")
    assert {f.name: np.dtype(f.dtype) for f in ds.schema} == {k: a.dtype for k, a in
                                                              data.items()}
    _same(ds, data)
    report = verify(tmp_path / "out")
    assert report.ok and report.records_checked == N  # checksummed like any conversion


@pytest.mark.parametrize("fmt", FORMATS)
def test_iterable_of_samples_round_trips(tmp_path, fmt):
    data = _arrays()
    gen = ({k: a[i] for k, a in data.items()} for i in range(N))  # unsized, read once
    res = pack_arrays(gen, tmp_path / "out", to=fmt)
    assert res.written == N
    ds = feedpipe.open_dataset(tmp_path / "out")
    _same(ds, data)
    assert ds.manifest.conversion["inputs"] == N


def test_text_and_loader_batches(tmp_path):
    data = {"x": np.arange(12, dtype=np.float32).reshape(6, 2), "name": np.array(list("abcdef"))}
    pack_arrays(data, tmp_path / "out", to="lmdb")
    ds = feedpipe.open_dataset(tmp_path / "out")
    assert [s["name"] for s in ds] == list("abcdef")
    batches = list(feedpipe.make_loader(tmp_path / "out", 4, fields=["x"], shuffle=False,
                                        device="cpu", num_workers=0))
    assert batches[0]["x"].dtype.is_floating_point and batches[0]["x"].shape == (4, 2)
    assert np.array_equal(np.concatenate([b["x"].numpy() for b in batches]), data["x"])


def test_a_sample_that_differs_is_skipped_and_named(tmp_path):
    rows = [{"x": np.ones(3, np.float32)} for _ in range(5)]
    rows[2] = {"x": np.ones(3, np.float64)}  # would be cast silently by the writer
    rows[3] = {"x": np.ones(4, np.float32)}
    rows[4] = {"z": np.ones(3, np.float32)}
    res = pack_arrays(rows, tmp_path / "out", to="lmdb")
    assert res.written == 2
    reasons = {s["path"]: s["reason"] for s in res.skipped}
    assert "float64" in reasons["sample 2"] and "shape" in reasons["sample 3"]
    assert "keys" in reasons["sample 4"]
    assert len(feedpipe.open_dataset(tmp_path / "out").manifest.skipped) == 3
    with pytest.raises(BadInputError, match="sample 2.*float64"):
        pack_arrays(rows, tmp_path / "strict", to="lmdb", strict=True)
    assert not (tmp_path / "strict").exists()


@pytest.mark.parametrize("data, match", [
    ({"x": np.zeros((4, 2)), "y": np.zeros(3)}, "different lengths.*'x': 4, 'y': 3"),
    ({"x": np.array([1, "a", None], dtype=object)}, "'x'.*object dtype"),
    ({"x": [[1, 2], [3]]}, "'x'.*not one array"),
    ({"x": np.array(["2020-01-01"], dtype="datetime64[D]")}, "'x'.*datetime64"),
    ({"my col": np.zeros(3)}, "'my col' is not a field name"),
    ({"image": np.zeros(3)}, "'image' is reserved"),
    ({"x": np.float32(1)}, "'x' is a single value"),
    ({}, "no arrays"),
])
def test_bad_arrays_are_typed_errors(tmp_path, data, match):
    with pytest.raises(BadInputError, match=match):
        pack_arrays(data, tmp_path / "out", to="lmdb")
    assert not any(tmp_path.iterdir())  # nothing claimed or written


def test_empty_iterable_and_bad_options(tmp_path):
    with pytest.raises(BadInputError, match="no samples"):
        pack_arrays(iter([]), tmp_path / "out", to="lmdb")
    with pytest.raises(ConfigError, match="split by time"):
        pack_arrays({"x": np.zeros(4)}, tmp_path / "out", to="lmdb", series=True,
                    val_fraction=0.5)
    with pytest.raises(ConfigError, match="series=True"):
        pack_arrays({"x": np.zeros(4)}, tmp_path / "out", to="lmdb", train_fraction=0.5)
    with pytest.raises(ConfigError, match="to="):
        pack_arrays({"x": np.zeros(4)}, tmp_path / "out", to="zip")  # type: ignore[arg-type]


@pytest.mark.parametrize("interrupt", [RuntimeError, KeyboardInterrupt])
def test_an_interrupted_pack_leaves_nothing_that_reads_as_a_dataset(tmp_path, interrupt):
    def samples():
        for i in range(1000):
            if i == 600:
                raise interrupt("stopped mid-way")
            yield {"x": np.full(64, i, np.float32)}

    with pytest.raises(interrupt):
        pack_arrays(samples(), tmp_path / "out", to="lmdb")
    assert list(tmp_path.iterdir()) == []  # no output, partial or lock left
    with pytest.raises(FileNotFoundError):
        feedpipe.open_dataset(tmp_path / "out")
    pack_arrays({"x": np.zeros((3, 64), np.float32)}, tmp_path / "out", to="lmdb")
    assert len(feedpipe.open_dataset(tmp_path / "out")) == 3  # a rerun succeeds


def test_missing_values_are_reported(tmp_path):
    x = np.ones((30, 2), np.float32)
    x[[4, 7, 7, 20], [0, 0, 1, 1]] = np.nan
    res = pack_arrays({"x": x, "n": np.arange(30)}, tmp_path / "out", to="hdf5")
    want = {"x": {"values": 4, "rows": 3, "first_rows": [4, 7, 20]}}
    assert res.missing == want
    assert feedpipe.open_dataset(tmp_path / "out").manifest.conversion["missing"] == want
    gen = ({"x": r} for r in x)
    assert pack_arrays(gen, tmp_path / "it", to="wds").missing == want


def test_val_fraction_splits_the_samples(tmp_path):
    data = {"x": np.arange(50, dtype=np.float32)}
    res = pack_arrays(data, tmp_path / "out", to="lmdb", val_fraction=0.2, seed=1)
    assert res.splits == {"train": 40, "val": 10}
    got = sorted(float(s["x"]) for split in ("train", "val")
                 for s in feedpipe.open_dataset(tmp_path / "out" / split))
    assert got == list(range(50))


def test_series_is_stored_once_in_blocks_with_train_statistics(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1000, 3)).astype(np.float32)
    a[800:] += 1000  # the later rows must not move the statistics
    res = pack_arrays({"a": a, "t": np.arange(1000)}, tmp_path / "s", to="lmdb", series=True,
                      train_fraction=0.8, block_rows=128)
    assert res.written == 8  # ceil(1000 / 128) blocks
    ds = feedpipe.open_dataset(tmp_path / "s")
    series = ds.manifest.conversion["series"]
    assert series["rows"] == 1000 and series["block_rows"] == 128 and series["train_rows"] == 800
    np.testing.assert_allclose(series["stats"]["a"]["mean"], a[:800].mean(0, dtype=np.float64),
                               rtol=1e-6)
    np.testing.assert_allclose(series["stats"]["a"]["std"], a[:800].std(0, dtype=np.float64),
                               rtol=1e-6)
    assert series["stats"]["t"]["mean"] == pytest.approx(399.5)
    stored = np.concatenate([s["a"] for s in ds])
    assert stored.dtype == np.float32 and np.array_equal(stored, a)


# --- the CLI ---------------------------------------------------------------------------------------

def _convert(capsys, src: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return cli_main(capsys, "convert", src, "--to", "lmdb", "-o", out, "-q", *extra)


def test_cli_npy_and_npz(tmp_path, capsys):
    x = np.random.default_rng(1).random((20, 3)).astype(np.float32)
    np.save(tmp_path / "feats.npy", x)
    rc, out, err = _convert(capsys, tmp_path / "feats.npy", tmp_path / "a")
    assert rc == 0, err
    ds = feedpipe.open_dataset(tmp_path / "a")
    assert ds.schema.names == ["feats"] and np.array_equal(np.stack([s["feats"] for s in ds]), x)
    np.savez(tmp_path / "t.npz", x=x, y=np.arange(20, dtype=np.int32))
    rc, out, err = _convert(capsys, tmp_path / "t.npz", tmp_path / "b", "--columns", "y")
    assert rc == 0, err
    ds = feedpipe.open_dataset(tmp_path / "b")
    assert ds.schema.names == ["y"] and ds[5]["y"].dtype == np.int32 and ds[5]["y"] == 5
    np.save(tmp_path / "obj.npy", np.array([1, "a"], dtype=object))
    rc, _, err = _convert(capsys, tmp_path / "obj.npy", tmp_path / "c")
    assert rc == 2 and err.count("\n") == 1 and "pickle" in err


CSV = "hour,pm2.5,TEMP,cbwd\n0,NA,-11.5,NW\n1,129,-12,SE\n2,148,-11,cv\n3,,-14,NW\n"


def test_cli_csv_without_a_path_column(tmp_path, capsys):
    (tmp_path / "air.csv").write_text(CSV)
    rc, _, err = _convert(capsys, tmp_path / "air.csv", tmp_path / "a")
    assert rc == 2 and err.count("\n") == 1  # one line, no traceback
    assert "'cbwd' is not numeric" in err and "--columns" in err
    rc, out, err = _convert(capsys, tmp_path / "air.csv", tmp_path / "a", "--columns",
                            "hour,pm2.5,TEMP", "--dtype", "float32")
    assert rc == 0, err
    assert "'pm2.5' stored as field 'pm2_5'" in out
    assert "missing values (NaN) in pm2_5: 2 in 2 rows (first rows 0, 3)" in out
    ds = feedpipe.open_dataset(tmp_path / "a")
    types = {f.name: np.dtype(f.dtype) for f in ds.schema}
    assert types == {"hour": np.int64, "pm2_5": np.float32, "TEMP": np.float32}
    assert [float(s["TEMP"]) for s in ds] == [-11.5, -12, -11, -14]
    assert np.isnan(ds[0]["pm2_5"]) and ds[1]["pm2_5"] == 129
    rc, _, err = _convert(capsys, tmp_path / "air.csv", tmp_path / "b", "--columns",
                          "hour,cbwd,pm2.5", "--series", "--train-fraction", "0.5")
    assert rc == 0, err
    series = feedpipe.open_dataset(tmp_path / "b")
    assert series[0]["cbwd"] == ["NW", "SE", "cv", "NW"]  # text kept when named, as JSON
    assert series.manifest.conversion["series"]["stats"]["hour"]["mean"] == 0.5


def test_cli_csv_with_a_misnamed_path_column_says_so(tmp_path, capsys):
    (tmp_path / "m.csv").write_text("file,label\na.jpg,0\nb.jpg,1\n")
    rc, _, err = _convert(capsys, tmp_path / "m.csv", tmp_path / "o")
    assert rc == 2 and err.count("\n") == 1
    assert "'file' is not numeric" in err and "an image manifest needs a 'path' column" in err
    assert not (tmp_path / "o").exists()


def test_cli_csv_bad_rows_are_skipped_and_named(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("a,b\n1,2\n3\n4,5\n")
    rc, out, err = _convert(capsys, tmp_path / "t.csv", tmp_path / "a")
    assert rc == 0, err
    assert "skipped t.csv:3: 1 cells, the header has 2" in out
    assert len(feedpipe.open_dataset(tmp_path / "a")) == 2
    rc, _, err = _convert(capsys, tmp_path / "t.csv", tmp_path / "b", "--strict")
    assert rc == 2 and "t.csv:3" in err and err.count("\n") == 1


def test_cli_jsonl_table(tmp_path, capsys):
    rows = [{"x": [i, i + 0.5], "y": i} for i in range(6)] + [{"x": [1.0, None], "y": None}]
    (tmp_path / "t.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\nnot json\n")
    rc, out, err = _convert(capsys, tmp_path / "t.jsonl", tmp_path / "a")
    assert rc == 0, err
    assert "skipped t.jsonl:8: invalid JSON" in out
    ds = feedpipe.open_dataset(tmp_path / "a")
    assert ds[2]["x"].tolist() == [2, 2.5] and ds[2]["y"] == 2 and np.isnan(ds[6]["y"])


def test_cli_refuses_options_of_the_other_kind(tmp_path, capsys, photo_dir):
    np.save(tmp_path / "a.npy", np.zeros((3, 2), np.float32))
    rc, _, err = _convert(capsys, tmp_path / "a.npy", tmp_path / "o", "--resize", "32")
    assert rc == 2 and "--resize applies to images only" in err
    rc, _, err = _convert(capsys, photo_dir, tmp_path / "p", "--series")
    assert rc == 2 and "--series apply to array tables" in err


def test_cli_image_manifest_still_goes_to_the_image_packer(tmp_path, capsys, photos):
    rows = "path,label\n" + "".join(f"{p.path},{p.label}\n" for p in photos[:3])
    (tmp_path / "m.csv").write_text(rows)
    rc, out, err = _convert(capsys, tmp_path / "m.csv", tmp_path / "o")
    assert rc == 0, err
    assert "image" in feedpipe.open_dataset(tmp_path / "o").schema


def test_cli_parquet(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"v": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.float32(), 2)),
                      "n": pa.array([1, None, 3], pa.int32()),
                      "f": pa.array([0.5, 1.5, 2.5], pa.float32())})
    pq.write_table(table, tmp_path / "t.parquet")
    rc, out, err = _convert(capsys, tmp_path / "t.parquet", tmp_path / "a")
    assert rc == 0, err
    ds = feedpipe.open_dataset(tmp_path / "a")
    types = {f.name: (np.dtype(f.dtype), tuple(f.shape)) for f in ds.schema}
    assert types == {"v": (np.float32, (2,)), "n": (np.float64, ()), "f": (np.float32, ())}
    assert ds[2]["v"].tolist() == [5, 6] and np.isnan(ds[1]["n"]) and ds[1]["f"] == 1.5
