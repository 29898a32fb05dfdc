"""Windows cut at load time from a series stored once (feedpipe.dataset.windows): contents equal
numpy slicing of the series, splits by time never share a row, normalization statistics come
from the training rows only, gap policies, and the loader contract (shuffled windows, equal
batches on two ranks, exact resume mid-epoch)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import feedpipe
from converters.arrays import pack_arrays
from feedpipe import Sampler
from feedpipe.dataset.windows import Windows
from feedpipe.errors import ConfigError
from feedpipe.loader.sampler import World

ROWS = 500
KW = dict(fields=["x", "y", "start"], device="cpu", num_workers=0, seed=3)


def _series() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"temp": rng.standard_normal(ROWS).astype(np.float32),
            "wind": rng.standard_normal((ROWS, 2)).astype(np.float32),
            "pm25": (rng.random(ROWS) * 100).astype(np.float64),
            "hour": np.arange(ROWS, dtype=np.int64) % 24}


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """The series packed as blocks in each format (train_fraction 0.8), and one row per sample."""
    root = tmp_path_factory.mktemp("series")
    out = {fmt: root / fmt for fmt in ("lmdb", "hdf5", "wds")}
    for fmt, path in out.items():
        pack_arrays(_series(), path, to=fmt, series=True, train_fraction=0.8, block_rows=64)
    out["rows"] = root / "rows"
    pack_arrays(_series(), out["rows"], to="lmdb")
    return out


def _reference(cols: dict[str, np.ndarray], features, targets, length, horizon, starts):
    """x and y of each window by plain numpy slicing of the series."""
    x = np.concatenate([cols[n].reshape(ROWS, -1) for n in features], axis=1)
    y = np.concatenate([cols[n].reshape(ROWS, -1) for n in targets], axis=1)
    return ([x[s:s + length].astype(np.float32) for s in starts],
            [y[s + length:s + length + horizon].astype(np.float32) for s in starts])


@pytest.mark.parametrize("source", ["lmdb", "hdf5", "wds", "rows"])
@pytest.mark.parametrize("length, horizon, stride", [(24, 6, 1), (7, 1, 3)])
def test_windows_equal_numpy_slices_of_the_series(packed, source, length, horizon, stride):
    feats, targets = ["temp", "wind", "pm25", "hour"], ["pm25"]
    w = Windows(packed[source], length=length, horizon=horizon, stride=stride, features=feats,
                targets=targets)
    starts = list(range(0, ROWS - length - horizon + 1, stride))
    assert len(w) == len(starts) and w.starts.tolist() == starts
    xs, ys = _reference(_series(), feats, targets, length, horizon, starts)
    for i in (0, 1, len(w) // 2, len(w) - 1):
        s = w[i]
        assert s["x"].dtype == np.float32 and s["x"].shape == (length, 5)
        assert np.array_equal(s["x"], xs[i]) and np.array_equal(s["y"], ys[i])
        assert s["start"] == starts[i]
    batches = list(feedpipe.make_loader(w, 16, shuffle=False, **KW))
    got = torch.cat([b["x"] for b in batches]).numpy()
    assert np.array_equal(got, np.stack(xs))  # the loader reads the same windows


def test_splits_by_time_never_share_a_row(packed):
    kw = dict(length=24, horizon=6, targets=["pm25"])
    train = Windows(packed["lmdb"], split=(0.0, 0.8), **kw)
    val = Windows(packed["lmdb"], split=(0.8, 1.0), **kw)
    assert train.rows == (0, 400) and val.rows == (400, 500)
    last_train = train.starts.max() + 30 - 1
    assert last_train <= 399 and val.starts.min() >= 400  # no window crosses the boundary
    assert len(train) == 400 - 30 + 1 and len(val) == 100 - 30 + 1
    named = Windows(packed["lmdb"], split="train", **kw), Windows(packed["lmdb"], split="val",
                                                                  **kw)
    assert [n.rows for n in named] == [(0, 400), (400, 500)]  # train_fraction 0.8
    rows = Windows(packed["lmdb"], split=(100, 200), **kw)
    assert rows.rows == (100, 200) and rows.starts[0] == 100 and rows.starts[-1] == 200 - 30
    with pytest.raises(ConfigError, match="train_fraction"):
        Windows(packed["rows"], split="train", **kw)  # packed without statistics
    with pytest.raises(ConfigError, match="no window of 24\\+6 rows"):
        Windows(packed["lmdb"], split=(0, 20), **kw)


def test_normalization_uses_the_training_rows_only(tmp_path):
    cols = _series()
    cols["temp"] = cols["temp"].copy()
    cols["temp"][400:] += 500  # a shift after the training rows
    pack_arrays(cols, tmp_path / "s", to="lmdb", series=True, train_fraction=0.8)
    w = Windows(tmp_path / "s", length=10, horizon=2, features=["temp"], targets=["temp"],
                normalize=True, split="train")
    mean, std = cols["temp"][:400].astype(np.float64).mean(), \
        cols["temp"][:400].astype(np.float64).std()
    (mx, sx), (my, _) = w.stats()["x"], w.stats()["y"]
    assert mx[0] == pytest.approx(mean) and sx[0] == pytest.approx(std) and my[0] == mx[0]
    want = ((cols["temp"][5:15].astype(np.float64) - mean) / std).astype(np.float32)
    np.testing.assert_allclose(w[5]["x"][:, 0], want, rtol=1e-5)
    assert abs(float(np.concatenate([w[i]["x"] for i in range(len(w))]).mean())) < 0.1
    val = Windows(tmp_path / "s", length=10, horizon=2, features=["temp"], targets=["temp"],
                  normalize=True, split="val")
    assert float(val[0]["x"].mean()) > 100  # the shift shows: val rows took no part
    pack_arrays(cols, tmp_path / "plain", to="lmdb", series=True)
    with pytest.raises(ConfigError, match="no normalization statistics"):
        Windows(tmp_path / "plain", length=10, targets=["temp"], normalize=True)


@pytest.fixture(scope="module")
def gappy(tmp_path_factory) -> tuple[Path, np.ndarray]:
    x = np.arange(100, dtype=np.float32) * 2
    x[[20, 21, 60]] = np.nan
    path = tmp_path_factory.mktemp("gaps") / "s"
    res = pack_arrays({"v": x, "t": np.arange(100.0)}, path, to="hdf5", series=True)
    assert res.missing == {"v": {"values": 3, "rows": 3, "first_rows": [20, 21, 60]}}
    return path, x


def test_gaps_are_refused_by_default_naming_the_rows(gappy):
    with pytest.raises(ConfigError, match=r"v in 3 rows \(first 20, 21, 60\).*gaps='skip'"):
        Windows(gappy[0], length=5, horizon=2, features=["v"], targets=["t"])


def test_gaps_skip_leaves_out_exactly_the_windows_touching_one(gappy):
    path, x = gappy
    w = Windows(path, length=5, horizon=2, features=["v"], targets=["t"], gaps="skip")
    every = range(0, 100 - 7 + 1)
    clean = [s for s in every if not np.isnan(x[s:s + 5]).any()]  # v is a feature only
    assert w.starts.tolist() == clean and w.left_out == len(every) - len(clean)
    assert not any(np.isnan(w[i]["x"]).any() for i in range(len(w)))
    as_target = Windows(path, length=5, horizon=2, features=["t"], targets=["v"], gaps="skip")
    assert as_target.starts.tolist() == [s for s in every
                                         if not np.isnan(x[s + 5:s + 7]).any()]


def test_gaps_fill_forward(tmp_path, gappy):
    path, x = gappy
    w = Windows(path, length=5, horizon=2, features=["v"], targets=["t"], gaps="fill")
    assert len(w) == 94 and w.left_out == 0
    assert w[18]["x"][:, 0].tolist() == [36, 38, 38, 38, 44]  # rows 18..22: 20, 21 take 19's
    lead = np.array([np.nan, np.nan, 3, np.nan, 5], np.float32)
    pack_arrays({"v": lead}, tmp_path / "lead", to="lmdb", series=True)
    w = Windows(tmp_path / "lead", length=4, horizon=1, targets=["v"], gaps="fill")
    assert w[0]["x"][:, 0].tolist() == [0, 0, 3, 3]  # nothing before the first value: 0


def test_shuffled_resume_exact_mid_epoch(packed):
    w = Windows(packed["wds"], length=12, horizon=3, targets=["pm25"])
    ref = list(feedpipe.make_loader(w, 8, **KW))
    starts = torch.cat([b["start"] for b in ref]).tolist()
    assert sorted(starts) == w.starts.tolist() and starts != sorted(starts)  # shuffled, all
    ld = feedpipe.make_loader(w, 8, **KW)
    it = iter(ld)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(ld.state_dict()))
    resumed = feedpipe.make_loader(Windows(packed["wds"], length=12, horizon=3,
                                           targets=["pm25"]), 8, **KW)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(ref) - 5
    for a, b in zip(ref[5:], rest, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("x", "y", "start"))


def test_two_ranks_get_equal_batches_of_disjoint_windows(packed):
    w = Windows(packed["hdf5"], length=24, horizon=6, stride=2, targets=["pm25"])
    assert len(w) % 2 == 0  # no padding: every window once
    ranks = [list(feedpipe.make_loader(w, 10, sampler=Sampler(world=World(r, 2)), **{**KW,
                                                                                     "num_workers": 1}))
             for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) > 1
    seen = [torch.cat([b["start"] for b in batches]).tolist() for batches in ranks]
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == w.starts.tolist()


def test_bad_options_are_config_errors(packed):
    kw = dict(length=4, targets=["pm25"])
    with pytest.raises(ConfigError, match="targets: 'nope' is not in the dataset"):
        Windows(packed["lmdb"], length=4, targets=["nope"])
    with pytest.raises(ConfigError, match="length=0"):
        Windows(packed["lmdb"], length=0, targets=["pm25"])
    with pytest.raises(ConfigError, match="gaps="):
        Windows(packed["lmdb"], gaps="drop", **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="split="):
        Windows(packed["lmdb"], split=(0.5, 0.2), **kw)
