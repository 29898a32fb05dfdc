"""A FIFO in place of a dataset file blocked ``verify`` and ``make_loader`` forever (its open
waits for a writer that never comes). Each call runs in a child process with a timeout, so a
regression fails here instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from fp_helpers import CLI

from feedpipe.dataset.manifest import MANIFEST_NAME
from feedpipe.storage import join, read_bytes
from feedpipe.storage.cache import Cache

pytestmark = pytest.mark.heavy
SPOTS = [("lmdb", "data.mdb"), ("hdf5", "data.h5"), ("wds", "index-offsets.npy"),
         ("wds", "shard-000002.tar")]
LIMIT = 60  # seconds: far above the few it takes; a hang would be forever
LOADER = """
import sys, feedpipe
try:
    source = (feedpipe.Remote(sys.argv[1], cache_dir=sys.argv[2]) if len(sys.argv) > 2
              else sys.argv[1])
    loader = feedpipe.make_loader(source, 8, size=32, num_workers=0, device="cpu")
    next(iter(loader))
except Exception as exc:
    print(type(exc).__name__, exc)
    sys.exit(3)
print("no error")
"""


def _run(cmd: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{cmd[-2:]}: still blocked after {LIMIT} s")
    return proc, time.monotonic() - t0


@pytest.mark.parametrize(("fmt", "name"), SPOTS)
def test_verify_and_make_loader_refuse_a_fifo(packed, copy_dataset, fmt, name):
    root = copy_dataset(packed[fmt])
    (root / name).unlink()
    os.mkfifo(root / name)
    proc, took = _run([*CLI, "verify", str(root)])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert f"'{name}' is a FIFO" in lines[0] and str(root) in lines[0]
    proc, took = _run([sys.executable, "-c", LOADER, str(root)])
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith("DamagedDataError") and f"'{name}' is a FIFO" in proc.stdout


def test_remote_cache_refuses_a_fifo(http_packed, tmp_path):
    """A FIFO in the node-local cache in place of a downloaded data file: refused when the
    cached manifest is read (the cache's own opens refuse one too: tests/test_cache_safety.py)."""
    server, urls = http_packed
    server.faults([])
    cache = tmp_path / "cache"
    folder = Cache(cache).dataset_dir(urls["lmdb"], read_bytes(join(urls["lmdb"], MANIFEST_NAME)))
    os.mkfifo(folder / "data.mdb")
    proc, took = _run([sys.executable, "-c", LOADER, urls["lmdb"], str(cache)])
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith("DamagedDataError") and "'data.mdb' is a FIFO" in proc.stdout
