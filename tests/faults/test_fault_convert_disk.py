"""A full disk mid-conversion: a clear one-line error, no half dataset, the input untouched.

Two real limits: a 2 MiB tmpfs (needs root to mount; skipped otherwise) and RLIMIT_FSIZE in the
child (any user: writes past the limit fail with EFBIG once SIGXFSZ is ignored).
"""

from __future__ import annotations

import resource
import signal
import subprocess
from pathlib import Path

import pytest
from fp_helpers import CLI
from test_fault_convert_output import tree_digest

import feedpipe

FORMATS = ["lmdb", "hdf5", "wds"]
# raw 128x128 RGB: 72 x 48 KiB = 3.4 MiB, more than the 2 MiB either limit allows
ARGS = ["--store", "raw", "--resize", "128", "--workers", "0", "-q"]


def _check(proc: subprocess.CompletedProcess[str], out: Path, src: Path,
           before: dict[str, str], fmt: str) -> None:
    # the HDF5 library crashes (SIGSEGV) when a write meets a full disk: its writer checks the
    # free space before each block instead, and must never get there
    assert proc.returncode == 2, (proc.returncode, proc.stdout + proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "filesystem is full" in lines[0] and str(out) in lines[0], lines
    assert not out.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == []  # no partial, no lock left
    assert tree_digest(src) == before


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the RLIMIT_FSIZE test covers it")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.heavy
@pytest.mark.parametrize("fmt", FORMATS)
def test_tmpfs_full(tmpfs, photo_dir, fmt):
    before = tree_digest(photo_dir)
    out = tmpfs / "out"
    proc = subprocess.run([*CLI, "convert", str(photo_dir), "--to", fmt, "-o", str(out), *ARGS],
                          capture_output=True, text=True, timeout=300)
    _check(proc, out, photo_dir, before, fmt)


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))


@pytest.mark.heavy
@pytest.mark.parametrize("fmt", FORMATS)
def test_file_size_limit(tmp_path, photo_dir, fmt):
    before = tree_digest(photo_dir)
    out = tmp_path / "dest" / "out"
    out.parent.mkdir()
    cmd = [*CLI, "convert", str(photo_dir), "--to", fmt, "-o", str(out), *ARGS]
    if fmt == "wds":
        cmd += ["--shard-count", "1000"]  # one shard, so that one file passes the limit
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          preexec_fn=_limit_file_size)
    _check(proc, out, photo_dir, before, fmt)
    # with the limit gone the same command succeeds: nothing was left in the way
    assert subprocess.run(cmd, capture_output=True, timeout=300).returncode == 0
    assert len(feedpipe.open_dataset(out)) == len(list(photo_dir.rglob("*.jpg")))
