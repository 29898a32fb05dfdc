"""Remote datasets under real processes: two torchrun ranks sharing one cache download each
shard once; a process killed mid-download leaves nothing that is read as whole."""

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
            local = feedpipe.make_loader(packed["wds"], 4, size=32, dtype="uint8",
                                         device="cpu", num_workers=0, fields=["label", "path"],
                                         seed=3, world=World(rank, 2))
            want = [{"label": b["label"].tolist(), "path": list(b["path"])} for b in local]
            assert json.loads((out / f"rank{rank}.json").read_text()) == want
    sizes = {f"/wds/{f.name}": f.size for f in feedpipe.open_dataset(packed["wds"]).manifest.files
             if f.name.endswith(".tar")}
    assert server.fetched(".tar") == sizes  # each shard's bytes served once, over both runs


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
