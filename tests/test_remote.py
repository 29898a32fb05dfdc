"""Datasets in object storage, against real servers on 127.0.0.1 (tests/servers.py): moto's S3
server behind a fault proxy, and a plain HTTP server with Range requests. Remote batches must be
the local batches; faults recover or fail typed; the cache stays within its limit."""

from __future__ import annotations

import fcntl
import os
import time

import pytest
import torch
from fp_helpers import REMOTE_KW, data_files, same_batches
from fp_helpers import remote_batches as batches
from servers import FaultServer

import feedpipe
from converters import convert
from feedpipe import Remote
from feedpipe.errors import (
    AccessDeniedError,
    BadInputError,
    ConfigError,
    CorruptRecordError,
    StorageError,
)
from feedpipe.storage import RetryPolicy, download, is_remote, local_path, read_bytes
from feedpipe.storage.cache import Cache

pytest.importorskip("fsspec")
FAST = RetryPolicy(attempts=4, base=0.01, cap=0.05)


def test_urls():
    assert is_remote("s3://b/k") and is_remote("https://h/x") and is_remote("hf://datasets/o/n")
    assert not is_remote("/data/ds") and not is_remote("file:///data/ds")
    assert local_path("file:///data/ds") == "/data/ds"
    with pytest.raises(ConfigError, match="ftp://"):
        is_remote("ftp://host/ds")


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_s3_batches_equal_local(moto_s3, s3_packed, packed, fmt, tmp_path):
    proxy, options = moto_s3
    local = batches(packed[fmt])
    proxy.faults([])
    remote = batches(Remote(s3_packed[fmt], cache_dir=tmp_path, storage_options=options))
    assert same_batches(local, remote) and len(local) == 9
    again = batches(Remote(s3_packed[fmt], cache_dir=tmp_path, storage_options=options))
    assert same_batches(local, again)  # the second run reads the cache: no data file fetched again
    fetched = [e["path"] for e in proxy.log() if e["method"] == "GET"
               and not e["path"].endswith(("feedpipe.json", ".npy"))]
    expect = set(data_files(packed[fmt]))
    assert {p.rsplit("/", 1)[1] for p in fetched} == expect
    assert len(fetched) == len(expect)  # each data file once, over two runs


def test_https_batches_equal_local_under_faults(http_packed, packed, tmp_path):
    """503s, a connection cut mid-body and a corrupted body: the loader recovers, same batches."""
    server, urls = http_packed
    server.faults([{"kind": "status", "status": 503, "times": 3, "match": ".tar"},
                   {"kind": "status", "status": 429, "times": 1, "match": ".tar"},
                   {"kind": "drop", "after": 3000, "times": 2, "match": ".tar"},
                   {"kind": "corrupt", "times": 1, "match": "shard-000002"}])
    remote = batches(Remote(urls["wds"], cache_dir=tmp_path))
    assert same_batches(batches(packed["wds"]), remote)
    statuses = [e["status"] for e in server.log()]
    assert statuses.count(503) == 3 and statuses.count(429) == 1


def test_corrupt_shard_is_refused_by_name(http_packed, tmp_path):
    server, urls = http_packed
    server.faults([{"kind": "corrupt", "times": -1, "match": "shard-000001"}])
    ds = feedpipe.open_dataset(urls["wds"], cache_dir=tmp_path)
    idx = ds.shard_ranges()[1].start
    with pytest.raises(CorruptRecordError, match="shard-000001.tar.*SHA-256"):
        ds[idx]
    assert not list(tmp_path.glob("*/shard-000001.tar*"))  # nothing of it kept
    server.faults([])
    assert ds[idx]["label"] == feedpipe.open_dataset(urls["wds"], cache_dir=tmp_path)[idx]["label"]


def test_missing_denied_and_exhausted_fail_typed(moto_s3, s3_packed, tmp_path):
    proxy, options = moto_s3
    proxy.faults([])
    with pytest.raises(BadInputError, match="s3://feedpipe-test/nope.*feedpipe.json"):
        feedpipe.open_dataset("s3://feedpipe-test/nope", cache_dir=tmp_path,
                              storage_options=options)
    proxy.faults([{"kind": "status", "status": 403, "times": -1}])
    with pytest.raises(AccessDeniedError, match="AWS_ACCESS_KEY_ID"):
        feedpipe.open_dataset(s3_packed["wds"], cache_dir=tmp_path, storage_options=options)
    assert len(proxy.log()) == 1  # at once, no retry
    proxy.faults([{"kind": "status", "status": 500, "times": -1, "match": ".tar"}])
    from feedpipe.dataset.remote import open_remote
    ds = open_remote(s3_packed["wds"], cache_dir=tmp_path, storage_options=options, policy=FAST)
    with pytest.raises(StorageError, match="s3://feedpipe-test/wds/shard-"):
        ds[0]
    proxy.faults([])


def test_cache_limit_holds_over_an_epoch(photo_dir, tmp_path):
    """An epoch over a dataset 3x the limit (12 shards): same batches, the cache never above
    its limit."""
    convert(photo_dir, tmp_path / "srv" / "ds", to="wds", workers=0,
            writer_options={"shard_count": 6})
    local = tmp_path / "srv" / "ds"
    sizes = [f.size for f in feedpipe.open_dataset(local).manifest.files
             if f.name.endswith(".tar")]
    limit = sum(sizes) // 3
    assert len(sizes) == 12 and limit >= 2 * max(sizes)
    server = FaultServer(root=tmp_path / "srv")
    try:
        cache = Cache(tmp_path / "cache", limit)
        ld = feedpipe.make_loader(Remote(f"{server.url}/ds", cache_dir=tmp_path / "cache",
                                         cache_limit=limit), 8, shuffle=False, **REMOTE_KW)
        seen, peak = [], 0
        for b in ld:
            seen.append(b["image"])
            peak = max(peak, cache.usage())
            assert sum(p.stat().st_size for p in cache.root.glob("*/shard-*.tar")) <= limit
        assert 0 < peak <= limit
        fetched = server.fetched(".tar")
        # each shard once; the feed engine may have begun the next epoch, whose first shard
        # (evicted under the limit) it then fetched again
        again = sum(fetched.values()) - sum(sizes)
        assert len(fetched) == 12 and again in (0, sizes[0])
    finally:
        server.stop()
    ref = [b["image"] for b in feedpipe.make_loader(local, 8, **REMOTE_KW, shuffle=False)]
    assert len(seen) == len(ref) and all(torch.equal(a, b) for a, b in zip(seen, ref, strict=True))


def test_single_file_format_over_limit_recommends_wds(http_packed, packed, tmp_path):
    server, urls = http_packed
    size = os.path.getsize(packed["hdf5"] / "data.h5")
    with pytest.raises(StorageError, match="--to wds"):
        feedpipe.open_dataset(urls["hdf5"], cache_dir=tmp_path, cache_limit=size // 2)


def test_partial_download_resumes_with_range(http_packed, packed, tmp_path):
    """A part file left by a cut transfer: the next download asks only for the missing bytes."""
    server, urls = http_packed
    server.faults([])
    data = (packed["wds"] / "shard-000000.tar").read_bytes()
    part = tmp_path / ".shard-000000.tar.part"
    part.write_bytes(data[:5000])
    download(f"{urls['wds']}/shard-000000.tar", part, len(data), policy=FAST)
    assert part.read_bytes() == data
    assert [e["range"] for e in server.log()] == [f"bytes=5000-{len(data) - 1}"]


def test_range_ignored_fails_at_once(http_packed, packed, tmp_path):
    """A server that answers a ranged GET with the whole file (a 200): said at once, typed,
    after one request (it was fetched 8 times, then called "unreachable")."""
    server, urls = http_packed
    data = (packed["wds"] / "shard-000000.tar").read_bytes()
    server.faults([{"kind": "norange", "times": -1}])
    start = time.monotonic()
    with pytest.raises(StorageError, match="shard-000000.tar: asked bytes 0-.*Range "
                                                     "request not supported") as err:
        download(f"{urls['wds']}/shard-000000.tar", tmp_path / "part", len(data),
                 chunk=len(data) // 3)
    assert time.monotonic() - start < 5 and err.value.url.endswith("shard-000000.tar")
    assert [e["status"] for e in server.log()] == [200]
    server.faults([])


def test_timeout_is_retried(http_packed, tmp_path):
    """A server that answers too late: the client's timeout is a transient failure."""
    aiohttp = pytest.importorskip("aiohttp")
    server, urls = http_packed
    server.faults([{"kind": "delay", "seconds": 3, "times": 1, "match": "feedpipe.json"}])
    options = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=1)}}
    raw = read_bytes(f"{urls['wds']}/feedpipe.json", options, FAST)
    assert b'"format": "wds"' in raw
    assert [e["status"] for e in server.log()] == [0, 200]  # held back, then the retry


def test_prefetch_reaches_the_next_shuffle_window(photo_dir, tmp_path):
    """A batch of a window-shuffled plan reads every shard of its window: handing out the first
    batch queues the next window's shards too (the plan is looked ahead by whole batches), so a
    bandwidth-bound epoch keeps the link busy instead of stalling at each window's start."""
    convert(photo_dir, tmp_path / "srv" / "ds", to="wds", workers=0,
            writer_options={"shard_count": 4})
    server = FaultServer(root=tmp_path / "srv")
    try:
        from feedpipe.dataset.remote import open_remote
        ds = open_remote(f"{server.url}/ds", cache_dir=tmp_path / "cache", prefetch=1)
        shard_of = ds._shard_of
        n = len(ds.shards)
        first, second = range(0, n // 2), range(n // 2, n)  # two windows of shards
        pick = [int(next(i for i in range(len(shard_of)) if shard_of[i] == s)) for s in range(n)]
        plan = [[pick[s] for s in first], [pick[s] for s in second]]
        ds.plan_ahead(plan, 0)
        ds._pool[1].shutdown(wait=True)
        assert set(server.fetched(".tar")) == {f"/ds/{ds.shards[s]}" for s in range(n)}
    finally:
        server.stop()


def test_prefetch_takes_room_in_plan_order(photo_dir, tmp_path):
    """Five prefetches at once in a cache with room for two shards: the two the plan reads
    first get it, not whichever download thread reserves first (a later shard taking the room
    makes the reader evict a sooner one, then fetch it twice)."""
    convert(photo_dir, tmp_path / "srv" / "ds", to="wds", workers=0,
            writer_options={"shard_count": 6})
    size = {f.name: f.size for f in feedpipe.open_dataset(tmp_path / "srv" / "ds").manifest.files}
    big = max(size.values())
    server = FaultServer(root=tmp_path / "srv")
    try:
        from feedpipe.dataset.remote import open_remote
        ds = open_remote(f"{server.url}/ds", cache_dir=tmp_path / "cache", prefetch=4,
                         cache_limit=3 * big - 1)
        same = [s for s, name in enumerate(ds.shards) if size[name] == big]
        order = [same[4], same[0], same[3], same[1], same[2]]  # not the shards' own order
        first = {int(s): i for i, s in reversed(list(enumerate(ds._shard_of)))}
        with open(ds.source.cache.root / ".lock", "a") as held:  # every claim queues on it
            fcntl.flock(held, fcntl.LOCK_EX)
            ds.plan_ahead([[first[s]] for s in order], 0)
            time.sleep(0.3)
        ds._pool[1].shutdown(wait=True)
        assert set(server.fetched(".tar")) == {f"/ds/{ds.shards[s]}" for s in order[:2]}
    finally:
        server.stop()
