"""The conversion's worker pool (converters/pool.py): results in order, a worker's exception
re-raised with its traceback, and a worker killed with SIGKILL (the OOM killer's signal) in the
middle of a task ends the wait at once with ResourceError naming the task's file, where
multiprocessing.Pool waited forever (tests/faults/test_fault_worker_death.py: the CLI)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from converters.worker import _pool
from feedpipe.errors import ResourceError


def test_results_in_order_and_errors_with_their_traceback():
    with _pool(2) as pool:
        tasks = [(f"f{k}.jpg", (k, 3)) for k in range(40)]
        assert list(pool.imap(pow, tasks, 3)) == [k ** 3 for k in range(40)]
        job = pool.submit(int, [("bad.jpg", ("x",))])[0]
        with pytest.raises(ValueError, match="invalid literal") as e:
            pool.result(job)
        assert "Traceback" in str(e.value.__cause__)  # the worker's own, kept


def started_then_sleep(marker: str) -> None:
    """A task that says it started (``marker`` appears), then works for a minute."""
    Path(marker).touch()
    time.sleep(60)


def test_sigkill_of_a_busy_worker_names_its_file(tmp_path):
    marker = tmp_path / "started"
    with _pool(1) as pool:
        pid = pool.result(pool.submit(os.getpid, [("first.jpg", ())])[0])
        job = pool.submit(started_then_sleep, [("slow.jpg", (str(marker),))])[0]
        while not marker.exists():
            assert not pool.ready(job)
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ResourceError, match=r"^slow\.jpg: the worker process converting it "
                           r"was killed by SIGKILL \(the OOM killer") as e:
            pool.result(job)
        assert time.monotonic() - t0 < 10 and e.value.file == "slow.jpg"
        assert isinstance(e.value, ResourceError)  # not damage: never a skipped sample
