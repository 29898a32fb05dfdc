"""kill -9 of one conversion worker (what the OOM killer does) mid-conversion: the conversion used
to wait forever at 0% CPU for the dead worker's result. It must stop within seconds with one line
naming the file the worker held, exit 2, remove its partial output and leave no process behind.
A real CLI run, real worker processes, a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import CLI, jpeg_bytes
from test_fault_convert_kill import tagged_pids, wait_no_orphans

pytestmark = pytest.mark.heavy  # a CLI conversion of 4 MP photos in a subprocess, ~3 s
LIMIT = 30  # seconds from the kill to the exit; the hang it replaces was forever
BUSY_MB = 80  # a worker's RSS while it re-encodes a 4 MP photo (its imports take ~40 MB)


@pytest.fixture(scope="module")
def big_photos(tmp_path_factory) -> Path:
    """70 copies of one 2000×2000 JPEG (over the 64 that start a worker pool): each re-encode
    takes ~0.1 s and tens of MB, so a worker in the middle of a file is seen by its memory."""
    root = tmp_path_factory.mktemp("big") / "src"
    root.mkdir()
    yy, xx = np.mgrid[:2000, :2000]
    img = np.stack([(xx * 7 + yy) % 256, (yy * 3) % 256, (xx ^ yy) % 256], -1).astype(np.uint8)
    data = jpeg_bytes(img, quality=90)
    for i in range(70):
        (root / f"{i:03d}.jpg").write_bytes(data)
    return root


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _workers(main: int, tag: str) -> list[int]:
    """The conversion's pool workers: tagged processes whose parent is tagged but not the main
    process (they are forked by the forkserver, the main process's child)."""
    tagged = set(tagged_pids(tag))
    return sorted(p for p in tagged if _ppid(p) in tagged - {main})


def _rss_mb(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024
    except (OSError, IndexError, ValueError):
        return 0.0


def _convert_and_kill_a_worker(src: Path, out: Path) -> tuple[int, str, float]:
    """Start the conversion, SIGKILL a worker in the middle of a file (its RSS over
    :data:`BUSY_MB`); (exit status, stderr, seconds from the kill to the exit)."""
    tag = f"FP_FAULT_{uuid.uuid4().hex}"
    proc = subprocess.Popen([*CLI, "convert", str(src), "--to", "lmdb", "-o", str(out),
                             "--store", "reencode", "--workers", "2", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, tag: "1"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (busy := [p for p in _workers(proc.pid, tag) if _rss_mb(p) > BUSY_MB]):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no worker ever decoded a photo"
            time.sleep(0.005)
        os.kill(busy[0], signal.SIGKILL)
        killed = time.monotonic()
        try:
            _, stderr = proc.communicate(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {LIMIT} s after a worker was killed")
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wait_no_orphans(tag)  # the other worker and the forkserver are gone too
    return proc.returncode, stderr, took


def test_kill9_of_a_worker_names_its_file_and_stops(tmp_path, big_photos):
    out = tmp_path / "out"
    for _ in range(3):  # a kill that lands between two files names none: try again
        rc, stderr, took = _convert_and_kill_a_worker(big_photos, out)
        if "between files" not in stderr:
            break
    lines = stderr.strip().splitlines()
    assert rc == 2 and len(lines) == 1, stderr  # one line, no traceback
    prefix = f"feedpipe convert: error: {big_photos}/"
    assert lines[0].startswith(prefix), lines[0]
    name = lines[0][len(prefix):].partition(":")[0]
    assert (big_photos / name).is_file()
    assert "the worker process converting it was killed by SIGKILL (the OOM killer" in lines[0]
    assert took < LIMIT
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no partial output, no lock left
