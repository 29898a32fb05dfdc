"""``feedpipe verify`` / ``feedpipe info``: clean datasets pass, damaged ones are named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import feedpipe
from feedpipe.formats import sample_key
from feedpipe.manifest import Manifest
from feedpipe.verify import verify

from conftest import N_PHOTOS
from fp_helpers import cli_main, flip_byte, run_cli

DATA_FILE = {"lmdb": "data.mdb", "hdf5": "data.h5", "wds": "shard-000001.tar"}


def test_clean_dataset_verifies(dataset_path, capsys):
    report = verify(dataset_path)
    assert report.ok, report.problems
    assert report.records_checked == N_PHOTOS
    assert report.files_checked == len(Manifest.read(dataset_path).files)
    rc, out, _ = cli_main(capsys, "verify", dataset_path)
    assert rc == 0 and "OK" in out and f"{N_PHOTOS} records" in out


def payload_offset(path: Path, payload: bytes) -> int:
    """Where a sample's stored JPEG lies inside a data file (it is stored unchanged)."""
    data = path.read_bytes()
    off = data.find(payload)
    assert off > 0 and data.count(payload) == 1
    return off


def test_flipped_byte_is_reported_naming_the_file(fmt, packed, photos, copy_dataset, capsys):
    root = copy_dataset(packed[fmt])
    name = DATA_FILE[fmt]
    jpg = photos[30].path.read_bytes()  # sample 30 lives in the second wds shard
    flip_byte(root / name, payload_offset(root / name, jpg) + len(jpg) // 2)
    report = verify(root)
    assert not report.ok
    assert any(str(root / name) in p and "checksum" in p for p in report.problems)
    rc, out, _ = cli_main(capsys, "verify", root)
    assert rc == 1 and "DAMAGED" in out and name in out
    if fmt == "wds":  # once through a real process: the exit status a shell script sees
        r = run_cli("verify", root)
        assert r.returncode == 1 and "DAMAGED" in r.stdout and name in r.stdout


def test_damaged_record_is_named_by_key(packed, photos, copy_dataset):
    root = copy_dataset(packed["lmdb"])
    jpg = photos[9].path.read_bytes()
    off = payload_offset(root / "data.mdb", jpg)
    # the record is b"FPR2" + u32 count + 3 u32 lengths + 3 u32 crc32 + the JPEG: break its magic
    flip_byte(root / "data.mdb", off - 32)
    report = verify(root)
    keyed = [p for p in report.problems if sample_key(9) in p]
    assert len(keyed) == 1 and "magic" in keyed[0]
    assert report.records_checked == N_PHOTOS - 1
    with pytest.raises(feedpipe.CorruptRecordError, match=sample_key(9)):
        feedpipe.open_dataset(root)[9]


def test_truncated_shard_is_reported(packed, copy_dataset, capsys):
    root = copy_dataset(packed["wds"])
    shard = root / "shard-000002.tar"
    os.truncate(shard, shard.stat().st_size // 3)
    report = verify(root)
    assert any(str(shard) in p and "size" in p for p in report.problems)
    assert any("truncated" in p for p in report.problems)  # records past the cut are named
    assert cli_main(capsys, "verify", root)[0] == 1


def test_missing_file_is_reported(fmt, packed, copy_dataset):
    root = copy_dataset(packed[fmt])
    (root / DATA_FILE[fmt]).unlink()
    report = verify(root)  # reports, does not crash
    assert any(DATA_FILE[fmt] in p and "missing" in p for p in report.problems)
    if fmt == "wds":  # the other shards are still checked; the lost shard's records are named
        assert report.records_checked == N_PHOTOS - 20
        assert sum(DATA_FILE[fmt] in p for p in report.problems) == 1 + 20


def test_info_prints_the_summary(dataset_path, fmt, photo_classes, capsys):
    rc, out, _ = cli_main(capsys, "info", dataset_path)
    assert rc == 0
    assert f"{N_PHOTOS} samples" in out
    assert fmt in out
    assert photo_classes[0] in out
    assert "skipped inputs: 0" in out
