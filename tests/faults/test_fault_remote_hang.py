"""A store that accepts connections and never answers (the fault server's ``hang`` rule): every
request fails typed within the configured ``timeout`` (each try) and its deadline (four tries'
worth), on either fetch client, and a process that has finished its work exits at once while
its plan-ahead prefetch still waits on the silent store."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from fp_helpers import REMOTE_KW
from servers import FaultServer

import feedpipe
from feedpipe import Remote
from feedpipe.errors import StorageError

pytestmark = pytest.mark.heavy
pytest.importorskip("aiohttp")
TIMEOUT = 0.5  # each try; the deadline is 4 times that
BOUND = 4 * TIMEOUT + TIMEOUT + 3.0  # deadline + the try in flight + a loaded machine's slack
HANG = {"kind": "hang", "seconds": 60, "times": -1}


def within(seconds: float, fn: Callable[[], Any]) -> tuple[BaseException | None, float]:
    """Run ``fn`` in a daemon thread: (what it raised, seconds it took); fails the test when it
    is still running after ``seconds`` (a hang must not hang the suite too)."""
    out: list[BaseException | None] = [None]

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out[0] = exc

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return out[0], time.monotonic() - start


@pytest.fixture
def silent(packed):
    """A fault server over the packed datasets: (server, {format: URL})."""
    server = FaultServer(root=next(iter(packed.values())).parent)
    try:
        yield server, {fmt: f"{server.url}/{p.name}" for fmt, p in packed.items()}
    finally:
        server.stop()


def test_silent_shards_fail_typed_within_the_timeout(silent, tmp_path):
    server, urls = silent
    server.faults([{**HANG, "match": ".tar"}])  # the manifest and index answer; shards never
    ds = feedpipe.open_dataset(urls["wds"], cache_dir=tmp_path, timeout=TIMEOUT, prefetch=0)
    exc, took = within(BOUND + 10, lambda: ds[0])
    assert isinstance(exc, StorageError), exc
    assert "shard-000000.tar" in str(exc) and f"waits {TIMEOUT:g} s" in str(exc)
    assert took < BOUND, took
    tries = [e for e in server.log() if e["path"].endswith(".tar")]
    assert 2 <= len(tries) <= 6  # retried until the deadline, not the 8 tries' worth of waits


def test_silent_store_fails_make_loader_at_open(silent, tmp_path):
    """The manifest itself never comes: make_loader's timeout= bounds the open."""
    server, urls = silent
    server.faults([HANG])
    exc, took = within(BOUND + 10, lambda: feedpipe.make_loader(
        Remote(urls["wds"], cache_dir=tmp_path, timeout=TIMEOUT), 8, **REMOTE_KW))
    assert isinstance(exc, StorageError), exc
    assert "feedpipe.json" in str(exc) and took < BOUND, (took, exc)


PROBE = """
import sys, time
import feedpipe
url, cache = sys.argv[1:3]
loader = feedpipe.make_loader(feedpipe.Remote(url, cache_dir=cache, timeout=2), 4, shuffle=False,
                              size=32, output=feedpipe.Output(dtype="uint8"), device="cpu",
                              num_workers=0)
batch = next(iter(loader))  # shard 0 answers; the prefetch of the next shards waits
time.sleep(0.5)  # the prefetch threads are in their requests
print("done", len(batch["label"]), flush=True)
"""


def test_finished_process_exits_while_a_prefetch_waits(silent, tmp_path):
    """The prefetch threads wait on shards 1 and 2 (a silent store, up to 10 s with timeout=2);
    the process has its batch and returns from its script: it exits at once."""
    server, urls = silent
    server.faults([{**HANG, "match": "shard-000001"}, {**HANG, "match": "shard-000002"}])
    proc = subprocess.Popen([sys.executable, "-c", PROBE, urls["wds"], str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        done = time.monotonic()
        assert line.strip() == "done 4", proc.stderr.read()  # type: ignore[union-attr]
        proc.wait(timeout=60)
        exited = time.monotonic() - done
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0
    waiting = {e["path"].rsplit("/", 1)[1] for e in server.log() if e["status"] == 0}
    assert {"shard-000001.tar", "shard-000002.tar"} <= waiting  # the prefetch did wait on them
    assert exited < 3, f"the process took {exited:.1f} s to exit after its work"
    assert not any(Path(tmp_path).glob("*/shard-000001.tar"))
