"""Soak: 20 epochs with 2 persistent workers under fork, spawn and forkserver.

Every process (main, each worker, multiprocessing's helpers) keeps its resident memory within 5%
of what it had after epoch 2; the workers are the same two processes throughout; no worker
survives ``del loader``; no shared-memory segment is left in /dev/shm, open or mapped. The soak
runs in a subprocess (soak_probe.py), in a private mount namespace with its own empty /dev/shm
where this machine allows one (root or user namespaces), so the listing is exact. Small data
(72 photos at 32², batch 8) keeps the three runs well under two minutes together.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EPOCHS = 20
SETTLED = 2   # epochs after which every process's memory is its steady state
SLACK = 0.05
PROBE = Path(__file__).with_name("soak_probe.py")


def _private_shm() -> list[str]:
    """The command prefix that gives the probe its own /dev/shm, or [] where none can be had."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    prefix = [unshare, "-m", "--propagation", "private"] + ([] if os.geteuid() == 0 else ["-r"])
    probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=256m tmpfs /dev/shm"],
                           capture_output=True)
    return prefix if probe.returncode == 0 else []


@pytest.mark.heavy
@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_twenty_epochs_flat_memory_no_leaks(packed, context):
    prefix = _private_shm()
    cmd = [sys.executable, str(PROBE), str(packed["lmdb"]), context, str(EPOCHS)]
    if prefix:
        cmd = [*prefix, "sh", "-c", 'mount -t tmpfs -o size=256m tmpfs /dev/shm && exec "$@"',
               "soak", *cmd]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(run.stdout.splitlines()[-1])
    assert r["samples"] == EPOCHS * 72
    assert len(r["workers"][0]) == 2 and all(w == r["workers"][0] for w in r["workers"])
    for proc, series in r["rss"].items():
        assert len(series) == EPOCHS, proc
        base = series[SETTLED]
        assert max(series[SETTLED:]) <= base * (1 + SLACK), (context, proc,
                                                             [s >> 20 for s in series])
    assert r["alive"] == [], f"workers left after del loader: {r['alive']}"
    before, after = r["before"], r["after"]
    assert after["fds"] == before["fds"] == [] and after["maps"] == before["maps"] == []
    if prefix:  # a private /dev/shm: it must be exactly as empty as it started
        assert after["listing"] == before["listing"] == []
    else:  # shared with other processes: only this run's torch segments are attributable
        assert not [n for n in set(after["listing"]) - set(before["listing"])
                    if n.startswith("torch_")]
