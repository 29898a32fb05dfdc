"""A disk that is already full: the remote-data cache's download and
``convert -o`` onto it each give one typed error naming the path (and the URL), leave no partial
file, and the CLI prints one line. A real 2 MiB tmpfs, filled to the last page (needs root to
mount: skipped otherwise)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fp_helpers import CLI
from test_fault_convert_disk import tmpfs  # noqa: F401 (a fixture)

import feedpipe
from feedpipe.errors import ResourceError, StorageError
from feedpipe.storage import download

pytestmark = pytest.mark.heavy


def _fill(mnt: Path, leave: int = 0) -> None:
    """Fill the filesystem at ``mnt`` up to its last page, then give ``leave`` bytes back."""
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        block = bytes(1 << 16)
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                if len(block) == 1:
                    break
                block = block[: len(block) // 2]
        if leave:
            os.ftruncate(fd, os.fstat(fd).st_size - leave)
    finally:
        os.close(fd)


def test_convert_onto_a_full_disk(tmpfs, photo_dir):  # noqa: F811
    _fill(tmpfs)
    out = tmpfs / "out"
    proc = subprocess.run([*CLI, "convert", str(photo_dir), "--to", "lmdb", "-o", str(out),
                           "--workers", "0", "-q"], capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "filesystem is full" in lines[0] and str(out) in lines[0] and "Free space" in lines[0]
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler"]  # no lock, no partial left


def test_cache_download_onto_a_full_disk(tmpfs, http_packed, packed):  # noqa: F811
    server, urls = http_packed
    server.faults([])
    size = os.path.getsize(packed["lmdb"] / "data.mdb")
    _fill(tmpfs, leave=64 << 10)  # room for the manifest and the lock, not for data.mdb
    cache = tmpfs / "cache"
    with pytest.raises(StorageError) as e:
        feedpipe.open_dataset(urls["lmdb"], cache_dir=cache)
    msg = str(e.value)
    assert f"{urls['lmdb']}/data.mdb" in msg and f"({size:,} bytes)" in msg
    assert "data.mdb: the cache's disk is full" in msg and "cache_limit" in msg
    assert e.value.url == f"{urls['lmdb']}/data.mdb"
    assert not list(cache.glob("*/.*.part")), "the partial download was left behind"
    # the same file fetched by itself (verify, doctor): typed, naming the file and the URL
    part = tmpfs / "data.mdb.part"
    with pytest.raises(ResourceError, match=rf"{part}: its filesystem is full .*{urls['lmdb']}"):
        download(f"{urls['lmdb']}/data.mdb", part, size)
    # room made: the same call works, with nothing in the way (in a child process: the reader's
    # descriptors must be gone before the tmpfs is unmounted)
    os.unlink(tmpfs / "filler")
    part.unlink()
    proc = subprocess.run([sys.executable, "-c", "import sys, feedpipe; print(len(feedpipe."
                           "open_dataset(sys.argv[1], cache_dir=sys.argv[2])))", urls["lmdb"],
                           str(cache)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "72", proc.stderr
