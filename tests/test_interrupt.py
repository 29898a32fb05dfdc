"""Interrupted conversions never read as datasets, and unfinished/malformed manifests are refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fp_helpers import CLI

import feedpipe
from feedpipe.dataset.manifest import MANIFEST_NAME, Manifest
from feedpipe.dataset.verify import verify
from feedpipe.errors import BadInputError, DamagedDataError

N_MANY = 2400


@pytest.fixture(scope="module")
def many_photos(tmp_path_factory, photos) -> Path:
    """A few thousand small JPEGs (copies of the session photos) in two class folders."""
    root = tmp_path_factory.mktemp("many") / "src"
    for c in range(2):
        (root / f"class{c}").mkdir(parents=True)
    for i in range(N_MANY):
        src = photos[i % len(photos)].path
        shutil.copyfile(src, root / f"class{i % 2}" / f"{i:05d}.jpg")
    return root


@pytest.mark.parametrize("fmt, workers", [
    ("lmdb", 1), ("hdf5", 1), ("wds", 1),
    pytest.param("lmdb", 2, marks=pytest.mark.heavy, id="lmdb-pool"),  # kill the CLI, not its pool
])
def test_killed_conversion_is_refused_and_rerun_succeeds(tmp_path, many_photos, fmt, workers):
    out = tmp_path / "out"
    partial = tmp_path / ".out.partial"
    cmd = [*CLI, "convert", str(many_photos), "--to", fmt, "-o", str(out), "--store", "reencode",
           "--workers", str(workers), "-q"]
    if fmt == "wds":
        cmd += ["--shard-count", "500"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not partial.exists():  # the writer has started on the temporary directory
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "conversion never started"
            time.sleep(0.01)
        time.sleep(0.4)  # let it write part of the data (re-encoding takes seconds in all)
        assert proc.poll() is None, "conversion finished before it could be interrupted"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert partial.is_dir() and any(partial.iterdir())  # a half-written leftover exists ...
    with pytest.raises((FileNotFoundError, BadInputError)):
        feedpipe.open_dataset(out)  # ... but nothing that reads as a dataset
    with pytest.raises((FileNotFoundError, BadInputError)):
        feedpipe.open_dataset(partial)

    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # leftover and lock cleared
    ds = feedpipe.open_dataset(out)
    assert len(ds) == N_MANY
    report = verify(out)
    assert report.ok, report.problems[:5]
    assert report.records_checked == N_MANY


# --- manifests that are missing, unfinished or malformed ----------------------------------------

@pytest.fixture
def ds_copy(packed, fmt, copy_dataset) -> Path:
    return copy_dataset(packed[fmt])


def edit_manifest(root: Path, **changes) -> None:
    path = root / MANIFEST_NAME
    d = json.loads(path.read_text(encoding="utf-8"))
    d.update(changes)
    path.write_text(json.dumps(d), encoding="utf-8")


def test_no_manifest(ds_copy):
    (ds_copy / MANIFEST_NAME).unlink()
    with pytest.raises(BadInputError, match="did not finish"):
        feedpipe.open_dataset(ds_copy)


def test_manifest_marked_incomplete(ds_copy):
    edit_manifest(ds_copy, complete=False)
    with pytest.raises(BadInputError, match="did not finish"):
        feedpipe.open_dataset(ds_copy)
    edit_manifest(ds_copy, complete="yes")
    with pytest.raises(BadInputError, match="did not finish"):
        feedpipe.open_dataset(ds_copy)


@pytest.mark.parametrize("cut", [0, 1, 100, -2])
def test_manifest_cut_short(ds_copy, cut):
    path = ds_copy / MANIFEST_NAME
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(BadInputError, match="did not finish"):
        feedpipe.open_dataset(ds_copy)


def test_manifest_temp_file_only(ds_copy):
    # the state a crash between writing the temp manifest and renaming it leaves behind
    os.rename(ds_copy / MANIFEST_NAME, ds_copy / "feedpipe.json.tmp")
    with pytest.raises(BadInputError, match="did not finish"):
        feedpipe.open_dataset(ds_copy)


def test_wrong_manifest_version(ds_copy):
    edit_manifest(ds_copy, feedpipe_manifest=2)
    with pytest.raises(DamagedDataError, match="version"):
        feedpipe.open_dataset(ds_copy)


def test_wrong_format_version(ds_copy):
    edit_manifest(ds_copy, format_version=99)
    with pytest.raises(DamagedDataError, match="version"):
        feedpipe.open_dataset(ds_copy)


def test_unknown_format(ds_copy):
    edit_manifest(ds_copy, format="parquet")
    with pytest.raises(DamagedDataError, match="parquet"):
        feedpipe.open_dataset(ds_copy)


@pytest.mark.parametrize("change", [
    {"num_samples": "many"}, {"schema": "image"}, {"schema": [{"name": "image", "kind": "video"}]},
    {"files": [{"name": "data.mdb"}]},
])
def test_malformed_manifest(ds_copy, change):
    edit_manifest(ds_copy, **change)
    with pytest.raises(DamagedDataError):
        feedpipe.open_dataset(ds_copy)


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        feedpipe.open_dataset(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):
        Manifest.read(tmp_path / "nope")


def test_manifest_written_by_convert_is_complete(packed, fmt):
    d = json.loads((packed[fmt] / MANIFEST_NAME).read_text(encoding="utf-8"))
    assert d["complete"] is True and d["format"] == fmt and d["feedpipe_manifest"] == 1
    assert d["num_samples"] == len(feedpipe.open_dataset(packed[fmt]))
    assert all(len(f["sha256"]) == 64 for f in d["files"])
    assert not (packed[fmt] / "feedpipe.json.tmp").exists()
