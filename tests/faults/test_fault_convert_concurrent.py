"""Conversions and readers at the same time: one conversion per output (an OS lock), and a reader
of a dataset being re-converted sees the old dataset, the new one, or DatasetReplacedError; never
the old manifest over the new files."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import N_PHOTOS
from fp_helpers import CLI, run_cli

import feedpipe
from converters import convert
from feedpipe.dataset.verify import verify
from feedpipe.errors import DatasetReplacedError, FeedpipeError

DRIVER = Path(__file__).with_name("convert_driver.py")


def kind(ds, photos) -> str:
    """'old' (passthrough: the stored bytes are the source files) or 'new' (re-encoded), read
    sample by sample; a reader that mixes the two fails here."""
    seen = set()
    for i in range(len(ds)):
        same = ds.read_raw(i)["image"] == photos[i].path.read_bytes()
        seen.add("old" if same else "new")
    assert len(seen) == 1, f"a mix of two datasets: {seen}"
    (k,) = seen
    assert k == ("old" if ds.manifest.conversion["store"] == "passthrough" else "new")
    return k


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_reader_opened_before_a_reconversion(tmp_path, photo_dir, photos, fmt):
    out = tmp_path / "out"
    opts = {"writer_options": {"shard_count": 20}} if fmt == "wds" else {}
    convert(photo_dir, out, to=fmt, workers=0, **opts)
    lazy = feedpipe.open_dataset(out)  # manifest read, data files not opened yet
    started = feedpipe.open_dataset(out)
    assert started.read_raw(0)["image"] == photos[0].path.read_bytes()  # files open (wds: shard 0)
    convert(photo_dir, out, to=fmt, workers=0, overwrite=True, store="reencode", **opts)

    with pytest.raises(DatasetReplacedError, match="open the dataset again"):
        lazy.read_raw(0)  # old manifest + new files would be a silent mix
    for i in range(N_PHOTOS):  # what was open keeps serving the old data, or refuses: no mix
        try:
            assert started.read_raw(i)["image"] == photos[i].path.read_bytes()
        except DatasetReplacedError:
            assert fmt == "wds" and i >= 20  # a shard not opened before the swap
    assert kind(feedpipe.open_dataset(out), photos) == "new"


@pytest.mark.heavy
def test_readers_during_repeated_overwrites(tmp_path, photo_dir, photos):
    out = tmp_path / "out"
    convert(photo_dir, out, to="wds", workers=0, writer_options={"shard_count": 8})
    kept = feedpipe.open_dataset(out)
    script = (f"from converters import convert\n"
              f"for k in range(6):\n"
              f"    convert({str(photo_dir)!r}, {str(out)!r}, to='wds', workers=0, overwrite=True,"
              f" store='reencode' if k % 2 == 0 else 'passthrough',"
              f" writer_options={{'shard_count': 8}})\n")
    proc = subprocess.Popen([CLI[0], "-c", script], stderr=subprocess.PIPE, text=True)
    seen: dict[str, int] = {"old": 0, "new": 0, "refused": 0}
    try:
        while proc.poll() is None:
            try:
                seen[kind(feedpipe.open_dataset(out), photos)] += 1
            except DatasetReplacedError:
                seen["refused"] += 1
            try:
                kind(kept, photos)
            except DatasetReplacedError:
                seen["refused"] += 1
    finally:
        stderr = proc.communicate(timeout=300)[1]
    assert proc.returncode == 0, stderr
    assert seen["old"] + seen["new"] > 0, seen
    assert verify(out).ok


def test_second_conversion_into_one_output_is_refused(tmp_path, photo_dir):
    out = tmp_path / "dest" / "out"
    go = tmp_path / "go"
    first = subprocess.Popen([CLI[0], str(DRIVER), "pause", str(photo_dir), str(out), "lmdb",
                              "--workers", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PAUSE_FILE": str(go)})
    try:  # the first conversion is mid-write, holding the output
        deadline = time.monotonic() + 120
        while not (out.parent / ".out.partial" / "data.mdb").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second = run_cli("convert", photo_dir, "--to", "lmdb", "-o", out, "--overwrite", "-q")
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stderr.strip() == (
            f"feedpipe convert: error: {out}: another feedpipe convert (pid {first.pid}) is "
            "writing this output; wait for it to finish or choose another -o")
        go.touch()
    finally:
        go.touch()
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr  # the first one finished undisturbed
    assert verify(out).ok and len(feedpipe.open_dataset(out)) == N_PHOTOS
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_lock_is_exclusive_and_dies_with_its_holder(tmp_path):
    from converters.swap import OutputLock
    from feedpipe.errors import ResourceError

    out = tmp_path / "out"
    holder = subprocess.Popen([CLI[0], "-c", (
        "import sys, time; from pathlib import Path; from converters.swap import OutputLock\n"
        f"OutputLock(Path({str(out)!r})).acquire(); print('locked', flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ResourceError, match=f"pid {holder.pid}"):
            OutputLock(out).acquire()
    finally:
        holder.kill()  # SIGKILL: no cleanup runs; the kernel drops the lock
        holder.wait()
    lock = OutputLock(out)
    lock.acquire()
    lock.release()
    assert not (tmp_path / ".out.lock").exists()
    assert isinstance(ResourceError("x"), FeedpipeError)
