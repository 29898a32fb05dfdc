"""The converter: determinism across worker counts and runs, splits, sources, overwrite, the CLI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import N_PHOTOS
from fp_helpers import cli_main, run_cli

import feedpipe
from converters import convert, scan
from feedpipe.dataset.manifest import Manifest
from feedpipe.dataset.verify import verify
from feedpipe.errors import (
    BadInputError,
    ConfigError,
)


def data_files(root: Path) -> dict[str, bytes]:
    """Every data file of a dataset (the manifest's list), by name."""
    return {f.name: (root / f.name).read_bytes() for f in Manifest.read(root).files}


def all_raw(root: Path) -> list[dict]:
    ds = feedpipe.open_dataset(root)
    return ds.read_raw_batch(range(len(ds)))


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_worker_count_does_not_change_output(tmp_path, photo_dir, fmt):
    one = convert(photo_dir, tmp_path / "w0", to=fmt, workers=0, store="reencode", quality=80)
    two = convert(photo_dir, tmp_path / "w2", to=fmt, workers=2, store="reencode", quality=80)
    assert one.reencoded == two.reencoded == N_PHOTOS
    a, b = all_raw(tmp_path / "w0"), all_raw(tmp_path / "w2")
    assert [r["path"] for r in a] == [r["path"] for r in b]
    assert a == b  # same keys, same order, same re-encoded bytes
    if fmt == "wds":
        da, db = feedpipe.open_dataset(tmp_path / "w0"), feedpipe.open_dataset(tmp_path / "w2")
        assert [da.key_of(i) for i in range(len(da))] == [db.key_of(i) for i in range(len(db))]
    assert data_files(tmp_path / "w0") == data_files(tmp_path / "w2")


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_passthrough_output_is_byte_identical_across_runs(tmp_path, photo_dir, fmt):
    convert(photo_dir, tmp_path / "a", to=fmt, workers=0)
    convert(photo_dir, tmp_path / "b", to=fmt, workers=2)
    fa, fb = data_files(tmp_path / "a"), data_files(tmp_path / "b")
    assert fa.keys() == fb.keys() and fa
    for name in fa:
        assert fa[name] == fb[name], name
    ma, mb = Manifest.read(tmp_path / "a"), Manifest.read(tmp_path / "b")
    assert ma.files == mb.files  # same sizes and checksums recorded


def test_output_exists_needs_overwrite(tmp_path, photo_dir, photos):
    out = tmp_path / "out"
    convert(photo_dir, out, to="lmdb", workers=0)
    with pytest.raises(FileExistsError):
        convert(photo_dir, out, to="lmdb", workers=0)
    assert len(feedpipe.open_dataset(out)) == N_PHOTOS  # untouched
    res = convert(photo_dir, out, to="wds", workers=0, overwrite=True)
    assert res.written == N_PHOTOS
    ds = feedpipe.open_dataset(out)
    assert ds.manifest.format == "wds" and not (out / "data.mdb").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no .old / .partial left


def test_reconverted_lmdb_is_read_fresh_in_the_same_process(tmp_path, photo_dir, photos):
    out = tmp_path / "out"
    convert(photo_dir, out, to="lmdb", workers=0, store="raw", resize=(8, 8))
    first = feedpipe.open_dataset(out)
    assert first[0]["image"].shape == (8, 8, 3)
    convert(photo_dir, out, to="lmdb", workers=0, overwrite=True)  # now passthrough JPEGs
    again = feedpipe.open_dataset(out)
    assert again.read_raw(0)["image"] == photos[0].path.read_bytes()
    assert again[5]["image"].shape[2] == 3 and again[5]["image"].shape[0] > 8


def split_paths(root: Path) -> tuple[list[str], list[str]]:
    return ([s["path"] for s in all_raw(root / "train")],
            [s["path"] for s in all_raw(root / "val")])


def test_val_split_cli_deterministic_disjoint_complete(tmp_path, photo_dir, photos, capsys):
    out = tmp_path / "split"
    rc, stdout, _ = cli_main(capsys, "convert", photo_dir, "--to", "wds", "-o", out,
                             "--val-fraction", "0.2", "--seed", "1", "-q")
    assert rc == 0 and "train 58" in stdout and "val 14" in stdout
    train, val = split_paths(out)
    assert len(val) == round(0.2 * N_PHOTOS) and len(train) == N_PHOTOS - len(val)
    assert not set(train) & set(val)
    assert sorted(train + val) == sorted(p.rel for p in photos)
    order = [p.rel for p in photos]  # each split keeps the source order
    assert train == sorted(train, key=order.index) and val == sorted(val, key=order.index)
    # the same split from the Python API and another format
    convert(photo_dir, tmp_path / "again", to="lmdb", workers=0, val_fraction=0.2, seed=1)
    assert split_paths(tmp_path / "again") == (train, val)
    convert(photo_dir, tmp_path / "other", to="lmdb", workers=0, val_fraction=0.2, seed=2)
    assert split_paths(tmp_path / "other")[1] != val
    for part in ("train", "val"):
        ds = feedpipe.open_dataset(out / part)
        assert ds.manifest.conversion["split"] == part
        labels = {p.rel: p.label for p in photos}
        assert all(s["label"] == labels[s["path"]] for s in all_raw(out / part))
    with pytest.raises(BadInputError, match="one per split"):
        feedpipe.open_dataset(out)  # the parent is not a dataset; the error says where to look


def test_cli_convert_info_verify_end_to_end(tmp_path, photo_dir, photos, capsys):
    exe = Path(sys.executable).parent / "feedpipe"  # the console script
    assert exe.exists()
    out = tmp_path / "cli out"
    r = subprocess.run([str(exe), "convert", str(photo_dir), "--to", "lmdb", "-o", str(out),
                        "--workers", "2", "-q"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"wrote {N_PHOTOS} samples" in r.stdout
    assert f"stored unchanged: {N_PHOTOS}" in r.stdout
    ds = feedpipe.open_dataset(out)
    assert [s["path"] for s in all_raw(out)] == [p.rel for p in photos]
    assert ds.read_raw(10)["image"] == photos[10].path.read_bytes()
    v = run_cli("verify", out)
    assert v.returncode == 0 and "OK" in v.stdout
    rc, info, _ = cli_main(capsys, "info", out)
    assert rc == 0 and f"{N_PHOTOS} samples" in info and "lmdb" in info
    rc, full, _ = cli_main(capsys, "info", out, "--json")
    full = json.loads(full)
    assert full["num_samples"] == N_PHOTOS and full["complete"] is True
    rc, _, err = cli_main(capsys, "convert", photo_dir, "--to", "lmdb", "-o", out, "-q")
    assert rc == 2 and "exists" in err


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    rc, _, err = cli_main(capsys, "convert", tmp_path / "missing", "--to", "lmdb", "-o",
                          tmp_path / "o")
    assert rc == 2 and "error" in err and "missing" in err
    rc, _, err = cli_main(capsys, "info", tmp_path)
    assert rc == 2 and "did not finish" in err
    rc, _, err = cli_main(capsys, "verify", tmp_path)
    assert rc == 2 and "did not finish" in err
    rc, _, err = cli_main(capsys, "convert", tmp_path, "--to", "lmdb", "-o", tmp_path / "o",
                          "--resize", "big")
    assert rc == 2 and "--resize" in err


@pytest.mark.parametrize("kwargs", [
    {"to": "zip"}, {"to": "lmdb", "store": "raw"}, {"to": "lmdb", "val_fraction": 1.0},
    {"to": "lmdb", "quality": 0}, {"to": "lmdb", "codec": "gif"}, {"to": "lmdb", "workers": -1},
    {"to": "lmdb", "check": "full"}, {"to": "lmdb", "store": "raw", "resize": 0},
])
def test_bad_options_are_config_errors(tmp_path, photo_dir, kwargs):
    with pytest.raises(ConfigError):
        convert(photo_dir, tmp_path / "o", **kwargs)
    assert not any(tmp_path.iterdir())


def test_manifest_sources_csv_and_jsonl(tmp_path, photos):
    root = tmp_path / "data"
    root.mkdir()
    rows = []
    for k, ph in enumerate(photos[:10]):
        name = f"img {k}.jpg"
        (root / name).write_bytes(ph.path.read_bytes())
        rows.append({"path": name, "label": ["zebra", "ant"][k % 2], "caption": f"photo #{k}"})
    with open(root / "list.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, ["path", "label", "caption"])
        w.writeheader()
        w.writerows(rows)
    res = convert(root / "list.csv", tmp_path / "csv", to="hdf5", workers=0)
    assert res.written == 10
    ds = feedpipe.open_dataset(tmp_path / "csv")
    assert ds.classes == ("ant", "zebra")
    assert ds.schema.names == ["image", "label", "path", "meta"]
    for k, s in enumerate(all_raw(tmp_path / "csv")):
        assert s["path"] == f"img {k}.jpg"
        assert ds.classes[s["label"]] == rows[k]["label"]
        assert s["meta"] == {"caption": f"photo #{k}"}
        assert s["image"] == photos[k].path.read_bytes()
    with open(root / "list.jsonl", "w", encoding="utf-8") as fh:
        for k, r in enumerate(rows):
            fh.write(json.dumps({"path": r["path"], "label": k % 3}) + "\n")
    ds = feedpipe.open_dataset(convert(root / "list.jsonl", tmp_path / "jsonl", to="wds",
                                       workers=0).out)
    assert [s["label"] for s in ds] == [k % 3 for k in range(10)]
    assert ds.classes == () and "meta" not in ds.schema


def test_flat_folder_has_no_labels(tmp_path, photos):
    src = tmp_path / "flat"
    (src / "nested").mkdir(parents=True)
    (src / "top.jpg").write_bytes(photos[0].path.read_bytes())
    (src / "nested" / "deep.jpg").write_bytes(photos[1].path.read_bytes())
    assert scan(src, layout="flat").kind == "folder"
    ds = feedpipe.open_dataset(convert(src, tmp_path / "o", to="lmdb", workers=0,
                                       layout="flat").out)
    assert ds.schema.names == ["image", "path"]
    assert [s["path"] for s in ds] == ["nested/deep.jpg", "top.jpg"]
    (src / "nested" / "deep.jpg").unlink()  # no image below the top level: a flat folder
    assert scan(src).kind == "folder" and [i.rel for i in scan(src).items] == ["top.jpg"]


def test_reencode_and_resize_options(tmp_path, photo_dir, photos):
    res = convert(photo_dir, tmp_path / "o", to="lmdb", workers=0, resize=64, codec="png")
    assert res.reencoded == N_PHOTOS and res.passthrough == 0
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert ds.schema["image"].codec == "png"
    for i in (0, 9):
        img = ds[i]["image"]
        assert min(img.shape[:2]) == 64
        assert ds.read_raw(i)["image"][:8] == b"\x89PNG\r\n\x1a\n"
    assert verify(tmp_path / "o").ok
    assert np.all(np.asarray([ds[i]["label"] for i in range(len(ds))])
                  == [p.label for p in photos])


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_empty_source_and_empty_split(tmp_path, photo_dir, fmt):
    # zero samples written is an error that says why, and leaves nothing on disk
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInputError, match="wrote 0 samples: the source holds no files"):
        convert(tmp_path / "empty", tmp_path / "o", to=fmt, workers=0)
    with pytest.raises(BadInputError, match="val split got 0 of"):
        convert(photo_dir, tmp_path / "s", to=fmt, workers=0, val_fraction=0.001)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]
