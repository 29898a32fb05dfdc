"""What a reader holds goes with it: a WebDataset keeps at most ``max_open_shards`` shards open
and closes them when it is collected; an LMDB environment is closed when the last reader of
its file goes (a replaced dataset's deleted data.mdb is unmapped, not kept until exit); a remote
LMDB/HDF5 file's pin in the cache is released with its reader, so the cache can evict it."""

from __future__ import annotations

import fcntl
import gc
import os
import shutil
from pathlib import Path

import pytest
from fp_helpers import REMOTE_KW

import feedpipe
from feedpipe import Remote
from feedpipe.errors import ConfigError
from feedpipe.storage import RetryPolicy


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def deleted_mappings(folder: Path) -> list[str]:
    """This process's memory mappings of deleted files under ``folder``."""
    with open("/proc/self/maps") as fh:
        return [line for line in fh if str(folder) in line and line.rstrip().endswith("(deleted)")]


def evictable(path: Path) -> bool:
    """Whether the cache could evict ``path``: no reader holds its shared lock."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_wds_keeps_at_most_max_open_shards_open(packed):
    ref = feedpipe.open_dataset(packed["wds"])
    ranges = ref.shard_ranges()
    assert len(ranges) >= 4
    order = [i for _ in range(2) for row in zip(*ranges, strict=False) for i in row]  # round-robin, twice
    want = {i: ref.read_raw(i)["image"] for i in set(order)}
    ref.close()
    gc.collect()
    start = open_fds()
    ds = feedpipe.open_dataset(packed["wds"], max_open_shards=2)
    base, peak = open_fds(), 0
    for i in order:
        assert ds.read_raw(i)["image"] == want[i]
        peak = max(peak, open_fds() - base)
    assert peak == 2
    del ds
    gc.collect()
    # the shards it had open closed with it, unclosed (fewer in a full run: earlier tests'
    # background threads and finalizers may close theirs meanwhile)
    assert open_fds() <= start
    with pytest.raises(ConfigError, match="max_open_shards=0"):
        feedpipe.open_dataset(packed["wds"], max_open_shards=0)


def test_wds_loader_dropped_closes_its_shards(packed):
    """make_loader in the main process, an epoch, dropped: no descriptor left behind (each
    create/epoch/drop cycle left one per shard open). Counted from after a first cycle; in a
    full run, earlier tests' background threads and finalizers may close theirs meanwhile."""
    counts = []
    for _ in range(4):
        loader = feedpipe.make_loader(packed["wds"], 8, **REMOTE_KW)
        assert sum(len(b["label"]) for b in loader) == len(loader.reader)  # type: ignore[attr-defined]
        del loader
        gc.collect()
        counts.append(open_fds())
    assert all(c <= counts[0] for c in counts[1:]), counts  # the old code: +1 per shard a cycle


def test_lmdb_env_closed_when_its_last_reader_goes(packed, tmp_path):
    """Two readers of one file share its environment (py-lmdb allows one per file and process);
    replacing the file under them leaves the old one mapped while one of them lives, and
    unmapped once both are gone."""
    ds = tmp_path / "ds"
    shutil.copytree(packed["lmdb"], ds)
    a = feedpipe.open_dataset(ds)
    loader = feedpipe.make_loader(ds, 8, **REMOTE_KW)
    first = a[0]["label"]
    assert sum(len(b["label"]) for b in loader) == len(a)
    assert a._envs[0] is loader.reader._envs[0]  # type: ignore[attr-defined]
    shutil.copy(ds / "data.mdb", tmp_path / "new.mdb")
    os.replace(tmp_path / "new.mdb", ds / "data.mdb")  # the old file is deleted, still mapped
    assert deleted_mappings(ds)
    del loader
    gc.collect()
    assert deleted_mappings(ds) and a[1]["label"] is not None  # a still reads it
    a.close()
    assert not deleted_mappings(ds)
    b = feedpipe.open_dataset(ds)  # the new file: a new environment
    assert b[0]["label"] == first and b._envs[0] is not None
    del a, b
    gc.collect()
    with open("/proc/self/maps") as fh:
        assert str(ds / "data.mdb") not in fh.read()


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_remote_single_file_pin_released_with_its_reader(http_packed, fmt, tmp_path):
    """The cached data file is held (never evicted) while its reader lives, released by close()
    (a read after it pins it again, fetching it anew if it was evicted meanwhile) and when the
    reader is collected."""
    server, urls = http_packed
    server.faults([])
    name = {"lmdb": "data.mdb", "hdf5": "data.h5"}[fmt]
    ds = feedpipe.open_dataset(urls[fmt], cache_dir=tmp_path)
    label = ds[0]["label"]
    [cached] = tmp_path.glob(f"*/{name}")
    assert not evictable(cached)
    ds.close()
    assert evictable(cached)
    cached.unlink()  # evicted
    server.faults([])  # clears the log
    assert ds[0]["label"] == label and cached.is_file() and not evictable(cached)
    assert [e["path"].rsplit("/", 1)[1] for e in server.log() if e["method"] == "GET"] == [name]
    del ds
    gc.collect()
    assert evictable(cached)


def test_timeout_option_is_checked(packed):
    policy = RetryPolicy.with_timeout(2)
    assert (policy.timeout, policy.deadline) == (2.0, 8.0)
    assert RetryPolicy.with_timeout(None) == RetryPolicy()
    for bad in (0, -1.0, "30", True):
        with pytest.raises(ConfigError, match="timeout="):
            RetryPolicy.with_timeout(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout=-1"):
        feedpipe.make_loader(Remote(packed["wds"], timeout=-1), 8)
