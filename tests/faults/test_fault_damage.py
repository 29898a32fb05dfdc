"""Damaged datasets: flipped bits and cut files in every format are caught by ``verify`` (naming
the key) and by the loader under either ``on_error`` setting; no wrong batch ever comes out.

A bit flipped inside a JPEG's entropy-coded data still decodes, to wrong pixels: only the
per-record crc32 (format version 2) catches it. The random-flip trials run in a subprocess, so a
crash in a native library would fail the test instead of killing pytest.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import cli_main, flip_byte, rerecord
from fuzz_driver import run_cases
from PIL import Image

import feedpipe
from feedpipe import Output, Workers
from feedpipe.dataset.registry import sample_key
from feedpipe.dataset.verify import verify
from feedpipe.errors import (
    CorruptRecordError,
    DamagedDataError,
    DataFileMismatchError,
    FeedpipeError,
)

DATA_FILE = {"lmdb": "data.mdb", "hdf5": "data.h5", "wds": "shard-000001.tar"}
BAD = 30  # lives in the second WebDataset shard of the test run's dataset
KW = dict(size=32, crop="resize", shuffle=False, num_workers=0, device="cpu",
          fields=("image", "label", "path"), output=Output(dtype="uint8", mean=None, std=None))


def by_path(loader) -> dict[str, np.ndarray]:
    """Every image the loader yields, keyed by its stored source path."""
    out = {}
    for batch in loader:
        for path, img in zip(batch["path"], batch["image"], strict=True):
            out.setdefault(path, []).append(img.numpy().copy())
    return out


def payload_offset(path: Path, payload: bytes) -> int:
    data = path.read_bytes()
    off = data.find(payload)
    assert off > 0 and data.count(payload) == 1
    return off


def test_a_flip_in_jpeg_entropy_data_decodes_to_wrong_pixels(photos):
    # why checksums are needed: the decoder does not notice this damage
    jpg = bytearray(photos[BAD].path.read_bytes())
    jpg[len(jpg) * 3 // 4] ^= 0x10
    damaged = np.asarray(Image.open(io.BytesIO(bytes(jpg))).convert("RGB"))
    original = np.asarray(Image.open(photos[BAD].path).convert("RGB"))
    assert damaged.shape == original.shape and (damaged != original).any()


def test_flipped_bit_in_an_image_is_caught_everywhere(fmt, packed, photos, copy_dataset,
                                                      capsys):
    root = copy_dataset(packed[fmt])
    jpg = photos[BAD].path.read_bytes()
    data = root / DATA_FILE[fmt]
    flip_byte(data, payload_offset(data, jpg) + len(jpg) * 3 // 4)
    key, source = sample_key(BAD), photos[BAD].rel

    report = verify(root)
    keyed = [p for p in report.problems if key in p]
    assert len(keyed) == 1 and "checksum" in keyed[0] and source in keyed[0], report.problems
    assert report.records_checked == len(photos) - 1
    rc, out, _ = cli_main(capsys, "verify", root)
    assert rc == 1 and key in out

    with pytest.raises(CorruptRecordError) as exc:  # on_error="raise"
        list(feedpipe.make_loader(root, 8, **KW))
    assert str(root) in str(exc.value) and key in str(exc.value) and source in str(exc.value)
    assert exc.value.key == key and exc.value.file == source

    ld = feedpipe.make_loader(root, 8, workers=Workers(on_error="skip"), **KW)
    with pytest.warns(UserWarning, match="skipped 1 corrupt"):
        got = by_path(ld)
    assert source not in got and len(ld.skipped) == 1
    assert key in ld.skipped[0] and source in ld.skipped[0]
    want = by_path(feedpipe.make_loader(packed[fmt], 8, **KW))
    for path, images in got.items():  # every image that came out is the right one
        for img in images:
            assert np.array_equal(img, want[path][0]), path


def test_truncated_wds_shard_names_the_lost_keys(packed, photos, copy_dataset):
    root = copy_dataset(packed["wds"])
    shard = root / "shard-000002.tar"
    os.truncate(shard, shard.stat().st_size // 3)
    report = verify(root)
    lost = [i for i in range(40, 60) if any(sample_key(i) in p for p in report.problems)]
    assert lost and lost == list(range(lost[0], 60))  # every record past the cut, by key
    # each lost record names its source (the tar stream's own error names the last good member)
    assert all("source file" in p for p in report.problems if " key " in p), report.problems
    with pytest.raises(CorruptRecordError, match=sample_key(lost[0])):
        list(feedpipe.make_loader(root, 8, **KW))
    ld = feedpipe.make_loader(root, 8, workers=Workers(on_error="skip"), **KW)
    with pytest.warns(UserWarning, match="corrupt record"):  # substitutes may be lost ones too
        got = by_path(ld)
    assert not {photos[i].rel for i in lost} & set(got)
    assert {sample_key(i) for i in lost} == {s.split(" key ")[1][:9] for s in ld.skipped}


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_truncated_single_file_dataset_is_refused_whole(fmt, packed, copy_dataset):
    """An LMDB or HDF5 file cut short cannot say which records survive (LMDB would read pages
    past the end and die of SIGBUS): its size differs from the manifest's, so the file is named
    at open, under either on_error, and nothing is loaded."""
    root = copy_dataset(packed[fmt])
    data = root / DATA_FILE[fmt]
    os.truncate(data, data.stat().st_size // 2)
    report = verify(root)
    assert any(str(data) in p and "cut short" in p for p in report.problems)
    for on_error in ("raise", "skip"):
        batches = []
        with pytest.raises(DataFileMismatchError, match=DATA_FILE[fmt]):
            for b in feedpipe.make_loader(root, 8, workers=Workers(on_error=on_error), **KW):
                batches.append(b)
        assert not batches  # no batch at all rather than a wrong one


def test_version_1_datasets_still_read_and_say_they_carry_no_checksums(fmt, packed,
                                                                        copy_dataset, capsys):
    """LMDB version 1 reads; a WebDataset or HDF5 version 1 (an older layout) is refused by a
    DamagedDataError that says to re-convert, in Python and on the command line."""
    from fp_helpers import downgrade_to_v1

    root = downgrade_to_v1(copy_dataset(packed[fmt]), fmt)
    if fmt != "lmdb":
        with pytest.raises(DamagedDataError, match=f"{fmt} format version 1 is no longer read.*"
                                                "re-convert"):
            feedpipe.open_dataset(root)
        for command in ("info", "verify"):
            rc, out, err = cli_main(capsys, command, root)
            assert rc == 2 and "re-convert" in err and "Traceback" not in err
        return
    ds, ref = feedpipe.open_dataset(root), feedpipe.open_dataset(packed[fmt])
    assert ds.manifest.format_version == 1 and not ds.checksums
    for i in (0, BAD, len(ref) - 1):
        a, b = ds[i], ref[i]
        assert np.array_equal(a["image"], b["image"]) and a["path"] == b["path"]
    report = verify(root)
    assert report.ok, report.problems
    assert any("no record checksums" in n for n in report.notes)
    rc, out, _ = cli_main(capsys, "verify", root)
    assert rc == 0 and "NOTE" in out and "no record checksums" in out
    rc, out, _ = cli_main(capsys, "info", root)
    assert rc == 0 and "format v1" in out and "record checksums: none" in out


# --- random flips: every record reads back exactly, or raises a typed error ----------------

def flip_trials(src: str, fmt: str, seed: int, count: int, work: str) -> None:
    """``count`` copies of ``src``, one random byte flipped in each data file of the copy;
    every record must read back equal to the original or raise a FeedpipeError, and every
    record that raises must be named by ``verify``. Run in a subprocess."""
    ref = feedpipe.open_dataset(src)
    want = ref.get_batch(range(len(ref)))
    rng = random.Random(seed)
    files = [f.name for f in ref.manifest.files]
    for trial in range(count):
        root = Path(work) / f"t{trial}"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(src, root)
        name = rng.choice(files)
        size = (root / name).stat().st_size
        if size:
            flip_byte(root / name, rng.randrange(size))
        failed = []
        try:
            ds = feedpipe.open_dataset(root)
            for i in range(len(ds)):
                try:
                    got = ds[i]
                except FeedpipeError:
                    failed.append(i)
                    continue
                w = want[i]
                assert got["label"] == w["label"] and got["path"] == w["path"], (name, i)
                assert np.array_equal(got["image"], w["image"]), (name, i)
        except FeedpipeError:
            failed = list(range(len(ref)))
        report = verify(root)
        assert not report.ok, name  # the file checksum at least
        text = "\n".join(report.problems)
        named = [i for i in failed if sample_key(i) in text]
        assert len(failed) == len(ref) or named == failed, (name, failed, report.problems)
        shutil.rmtree(root)


@pytest.mark.heavy
def test_random_flips_never_give_a_wrong_record(fmt, packed, tmp_path):
    paths = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
    code = (f"import sys; sys.path[:0] = {paths!r}; from test_fault_damage import flip_trials; "
            f"flip_trials({str(packed[fmt])!r}, {fmt!r}, 0, 200, {str(tmp_path)!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_undecodable_image_is_named_by_key_and_source_file(packed, photos, copy_dataset):
    """A record whose checksum matches but whose image no decoder reads (it was stored that
    way): the error names the source file as well as the key, in verify and in the loader."""
    import lmdb

    from feedpipe.schema.codecs import pack_record, unpack_record

    root = copy_dataset(packed["lmdb"])
    key, source = sample_key(BAD), photos[BAD].rel
    env = lmdb.open(str(root), subdir=True)
    with env.begin(write=True) as txn:
        parts = [bytes(p) for p in unpack_record(txn.get(key.encode()), 3)]
        parts[0] = b"\xff\xd8" + b"\x00" * 200  # a JPEG in name only
        txn.put(key.encode(), pack_record(parts))
    env.close()
    rerecord(root)  # as if converted that way
    problems = [p for p in verify(root).problems if key in p]
    assert len(problems) == 1 and source in problems[0], problems
    with pytest.raises(CorruptRecordError) as exc:
        list(feedpipe.make_loader(root, 8, **KW))
    assert key in str(exc.value) and source in str(exc.value)


@pytest.mark.heavy
def test_zeroed_pages_of_an_hdf5_file_give_a_typed_error_in_seconds(packed, tmp_path):
    """A 4 KiB page of zeros (a zeroed page inside a global heap sent libhdf5 round the same 16
    bytes forever, in C; the file holds none now) wherever libhdf5 parses: every page that is
    not wholly image bytes (the superblock, group, object headers, offsets, labels, checksums),
    and two inside the images: ``verify`` and ``make_loader`` (either on_error) answer within
    10 s with a typed error or the right samples (in a subprocess watched with a timeout)."""
    import h5py

    path = packed["hdf5"] / "data.h5"
    with h5py.File(path, "r") as f:
        start, size = f["image"].id.get_offset(), f["image"].id.get_storage_size()
    pages = [at for at in range(0, path.stat().st_size, 4096)
             if not (start <= at and at + 4096 <= start + size)]
    pages += [start // 4096 * 4096 + 8192, (start + size // 2) // 4096 * 4096]
    cases = {f"zeros at {at}": {"file": "data.h5", "offset": at, "length": 4096, "mode": "zero"}
             for at in pages}
    assert len(cases) >= 4
    failures = run_cases(packed["hdf5"], cases, tmp_path / "case")
    assert not failures, "\n".join(failures)
