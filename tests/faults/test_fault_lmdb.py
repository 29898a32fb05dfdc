"""LMDB's reader limit and read-only datasets.

- More concurrent reader processes than LMDB's default ``max_readers`` (126), each holding a read
  transaction at the same moment: all succeed, because feedpipe opens LMDB ``readonly`` with
  ``lock=False`` (no reader table). A control run through plain ``lmdb.open`` with the lock shows
  the same harness really hits the limit.
- A dataset on a read-only directory (``chmod -R a-w``) and on a read-only mount (a tmpfs
  remounted ``ro`` in a private mount namespace, which stops root too) opens and loads in every
  format, with worker processes, and nothing is written into it.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
import torch

import feedpipe
from feedpipe import Output
from feedpipe.dataset.verify import verify

READERS = 140  # > 126, LMDB's default max_readers
LMDB_DEFAULT_MAX_READERS = 126


def _feedpipe_reader(path: str, barrier, out) -> None:
    """Read every label through feedpipe, holding the read transaction across the barrier."""
    reader = feedpipe.open_dataset(path)
    labels: list[int] = []
    waited = False

    def keep(pos: int, stored: dict) -> None:
        nonlocal waited
        if not waited:  # inside the read transaction: every process holds one at once
            waited = True
            barrier.wait(120)
        labels.append(int(stored["label"]))

    try:
        reader.visit(range(len(reader)), keep, ["label"])
    except Exception as exc:  # noqa: BLE001 - reported to the test, which names it
        if not waited:
            barrier.wait(120)
        out.put(f"{type(exc).__name__}: {exc}")
        return
    out.put(sum(labels))


def _locked_reader(path: str, barrier, out) -> None:
    """The control: plain py-lmdb with its lock file and default reader table."""
    try:
        env = lmdb.open(path, readonly=True, lock=True)
        txn = env.begin()
    except lmdb.Error as exc:
        barrier.wait(120)
        out.put(type(exc).__name__)
        return
    barrier.wait(120)
    out.put(txn.stat()["entries"])


def _crowd(target, path: Path) -> list:
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(READERS), ctx.Queue()
    procs = [ctx.Process(target=target, args=(str(path), barrier, out)) for _ in range(READERS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(30)
    return results


@pytest.mark.heavy
def test_more_readers_than_lmdb_max_readers(packed, copy_dataset):
    expected = sum(int(s["label"]) for s in feedpipe.open_dataset(packed["lmdb"]))
    assert _crowd(_feedpipe_reader, packed["lmdb"]) == [expected] * READERS
    control = _crowd(_locked_reader, copy_dataset(packed["lmdb"]))  # writes lock.mdb: a copy
    assert control.count("ReadersFullError") == READERS - LMDB_DEFAULT_MAX_READERS
    assert control.count(72 + 1) == LMDB_DEFAULT_MAX_READERS  # 72 records and the dataset id


def _read_only(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        mode = p.stat().st_mode
        p.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir()}


@pytest.mark.heavy
@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_read_only_directory_loads(packed, copy_dataset, fmt):
    root = copy_dataset(packed[fmt])
    _read_only(root)
    before = _snapshot(root)
    try:
        kw = dict(size=32, device="cpu", seed=2, fields=["image", "label", "path"],
                  output=Output(dtype="uint8"))
        ref = list(feedpipe.make_loader(packed[fmt], 8, num_workers=0, **kw))
        got = list(feedpipe.make_loader(root, 8, num_workers=2, **kw))
        assert [b["path"] for b in got] == [b["path"] for b in ref]
        assert all(torch.equal(a["image"], b["image"]) for a, b in zip(got, ref, strict=True))
        assert verify(root).ok
        assert _snapshot(root) == before  # nothing written: no lock file, no index, no cache
        if fmt == "lmdb":  # as root chmod stops nothing: the open flags are what keep it honest
            reader = feedpipe.open_dataset(root)
            reader.visit([0], lambda pos, stored: None, ["label"])
            flags = reader._envs[0].flags()
            assert flags["readonly"] and not flags["lock"], flags
    finally:
        for p in [root, *root.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


_RO_PROBE = """
import json, sys
import feedpipe
out = {}
for fmt, path in json.loads(sys.argv[1]).items():
    ld = feedpipe.make_loader(path, 8, size=32, output=feedpipe.Output(dtype="uint8"),
                              device="cpu", num_workers=2, seed=2, fields=["label", "path"])
    out[fmt] = [p for b in ld for p in b["path"]]
print(json.dumps(out))
"""


@pytest.mark.heavy
def test_read_only_mount_loads_every_format(packed, tmp_path):
    """A tmpfs remounted read-only in a private mount namespace: even root cannot write there."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to make a private read-only mount")
    prefix = [unshare, "-m", "--propagation", "private"] + ([] if os.geteuid() == 0 else ["-r"])
    mnt = tmp_path / "ro"
    mnt.mkdir()
    paths = {fmt: str(mnt / fmt) for fmt in packed}
    script = (f"mount -t tmpfs -o size=64m tmpfs {mnt} && "
              + " && ".join(f"cp -a {packed[f]} {mnt / f}" for f in packed)
              + f" && mount -o remount,ro {mnt} && ! touch {mnt}/probe 2>/dev/null"
              + ' && exec "$@"')
    run = subprocess.run([*prefix, "sh", "-c", script, "ro", sys.executable, "-c", _RO_PROBE,
                          json.dumps(paths)], capture_output=True, text=True, timeout=300)
    if run.returncode and "mount" in run.stderr and "permission" in run.stderr.lower():
        pytest.skip(f"this machine allows no private mounts: {run.stderr.strip()[:200]}")
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    for fmt in packed:
        ref = feedpipe.make_loader(packed[fmt], 8, size=32, device="cpu",
                                   num_workers=0, seed=2, fields=["label", "path"],
                                   output=Output(dtype="uint8"))
        assert got[fmt] == [p for b in ref for p in b["path"]]
    assert not any(mnt.iterdir())  # the mount lived only in the namespace
