"""Remote datasets under real processes: two torchrun ranks sharing one cache download each
shard once; two torchrun nodes with a cache each download each shard once per node; a process
killed mid-download leaves nothing that is read as whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fp_helpers import free_port
from servers import FaultServer

import feedpipe
from converters import convert
from feedpipe import Output, Sampler
from feedpipe.loader.sampler import World

pytest.importorskip("aiohttp")
PROBE = Path(__file__).with_name("remote_probe.py")


@pytest.mark.heavy
def test_two_ranks_share_one_cache_each_shard_fetched_once(packed, http_packed, tmp_path):
    server, urls = http_packed
    server.faults([])
    cache = tmp_path / "cache"
    for run in range(2):  # the second run finds everything cached
        out = tmp_path / f"run{run}"
        out.mkdir()
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                            "2", "--master-port", str(free_port()), str(PROBE), urls["wds"],
                            str(cache), str(out)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        for rank in range(2):
            local = feedpipe.make_loader(packed["wds"], 4, size=32, device="cpu", num_workers=0,
                                         fields=["label", "path"],
                                         seed=3, output=Output(dtype="uint8"),
                                         sampler=Sampler(world=World(rank, 2)))
            want = [{"label": b["label"].tolist(), "path": list(b["path"])} for b in local]
            assert json.loads((out / f"rank{rank}.json").read_text()) == want
    sizes = {f"/wds/{f.name}": f.size for f in feedpipe.open_dataset(packed["wds"]).manifest.files
             if f.name.endswith(".tar")}
    assert server.fetched(".tar") == sizes  # each shard's bytes served once, over both runs


@pytest.mark.heavy
def test_two_nodes_one_cache_per_node(photo_dir, tmp_path):
    """torchrun --nnodes 2 (two ranks per node, static rendezvous on 127.0.0.1), each node with
    its own cache_dir, over HTTP: every shard is downloaded exactly once by each node (the
    server's log tells the nodes apart by an X-Client header), and each rank's batches equal
    those the same rank reads from the local copy. The dataset has fewer shards than ranks, so
    every rank reads every shard: both ranks of a node need each one, and only one may fetch it."""
    data = tmp_path / "served" / "wds3"
    convert(photo_dir, data, to="wds", workers=0, writer_options={"shard_count": 30})
    sizes = {f"/wds3/{f.name}": f.size for f in feedpipe.open_dataset(data).manifest.files
             if f.name.endswith(".tar")}
    assert len(sizes) == 3  # fewer shards than ranks: every rank reads every shard
    server = FaultServer(root=data.parent)
    procs, port = [], str(free_port())
    try:
        for node in (0, 1):
            options = json.dumps({"headers": {"X-Client": f"node{node}"}})
            log = (tmp_path / f"node{node}.log").open("w")  # a file: no pipe fills up meanwhile
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                 "--nproc-per-node", "2", "--node-rank", str(node), "--master-addr",
                 "127.0.0.1", "--master-port", port, str(PROBE), f"{server.url}/wds3",
                 str(tmp_path / f"cache{node}"), str(tmp_path), options],
                stdout=log, stderr=subprocess.STDOUT), log))
        for proc, log in procs:
            proc.wait(timeout=300)
            log.close()
            assert proc.returncode == 0, Path(log.name).read_text()
        per_node: dict[tuple[str, str], list[int]] = {}
        for e in server.log():
            if e["method"] == "GET" and e["path"].endswith(".tar"):
                assert e["status"] in (200, 206), e
                per_node.setdefault((e["client"], e["path"]), []).append(e["bytes"])
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        server.stop()
    # one request per shard and node (shards are under one download chunk), carrying it whole
    assert per_node == {(f"node{n}", path): [size] for n in (0, 1) for path, size in sizes.items()}
    for node in (0, 1):
        assert len(list((tmp_path / f"cache{node}").glob("*/shard-*.tar"))) == len(sizes)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(4)]
    for rank, got in enumerate(ranks):
        with pytest.warns(UserWarning, match="3 shards for 4 ranks"):  # split by sample
            local = feedpipe.make_loader(data, 4, size=32, device="cpu",
                                         num_workers=0, fields=["label", "path"], seed=3,
                                         output=Output(dtype="uint8"), sampler=Sampler(world=World(rank, 4)))
            want = [{"label": b["label"].tolist(), "path": list(b["path"])} for b in local]
        assert got == want
    assert len({len(r) for r in ranks}) == 1 and ranks[0]
    ds = feedpipe.open_dataset(data)
    assert {p for r in ranks for b in r for p in b["path"]} == {ds[i]["path"]
                                                                for i in range(len(ds))}


@pytest.mark.heavy
def test_killed_mid_download_leaves_no_entry(packed, tmp_path):
    """SIGKILL while a shard downloads (a throttled server): no shard file appears; the next
    process fetches it again and reads the same samples."""
    root = packed["wds"].parent
    server = FaultServer(root=root)
    try:
        server.faults([{"kind": "throttle", "rate": 20_000, "match": ".tar"}])
        cache = tmp_path / "cache"
        code = ("import sys, feedpipe; ds = feedpipe.open_dataset(sys.argv[1], cache_dir="
                "sys.argv[2]); ds[0]")
        proc = subprocess.Popen([sys.executable, "-c", code, f"{server.url}/wds", str(cache)],
                                env={**os.environ})
        deadline = time.monotonic() + 60
        while not list(cache.glob("*/.shard-*.part")):  # a download has begun
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not list(cache.glob("*/shard-*.tar"))  # only a .part (or nothing): never used
        server.faults([])
        ds = feedpipe.open_dataset(f"{server.url}/wds", cache_dir=cache)
        got, want = ds.read_raw(0), feedpipe.open_dataset(packed["wds"]).read_raw(0)
        assert got.keys() == want.keys() and all(bytes(got[k]) == bytes(want[k])
                                                  if isinstance(got[k], (bytes, memoryview))
                                                  else str(got[k]) == str(want[k]) for k in got)
        assert list(cache.glob("*/shard-000000.tar")) and not list(cache.glob("*/.*.part"))
    finally:
        server.stop()
