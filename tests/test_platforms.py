"""feedpipe beyond one Linux box: without the POSIX-only modules macOS and Windows lack, with
``spawn`` workers, and in a container's small /dev/shm (docs/install.md, docs/containers.md)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import shm_probe

import feedpipe
from feedpipe.checks import conforms

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def _env(*first: Path) -> dict[str, str]:
    path = [str(p) for p in first] + [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _batches(root: Path, fmt: str) -> list[tuple[list[str], list[int], str]]:
    """The probe's batches, made here by the main process alone (no workers, Linux as it is)."""
    loader = feedpipe.make_loader(root / fmt, 8, size=32, seed=3, device="cpu", num_workers=0,
                                  fields=["image", "label", "path"],
                                  output=feedpipe.Output(dtype="uint8"))
    return [(b["path"], b["label"].tolist(),
             hashlib.sha256(b["image"].numpy().tobytes()).hexdigest()) for b in loader]


def test_convert_and_load_without_posix_modules_and_with_spawn(tmp_path):
    """As on Windows (macOS lacks only some of it): feedpipe cannot import fcntl or resource,
    os.sched_getaffinity and signal masks are gone, spawn is the only start method. Conversion
    (its process pool) and loading (a spawned DataLoader worker) still work, and so do the
    other formats in one process; the batches are those this process makes on Linux as it is
    (spawn for every format on Linux: tests/test_loader.py)."""
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(TESTS / "platform_probe.py"), str(tmp_path),
                           str(report)], env=_env(TESTS / "platform_site"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(report.read_text())
    assert got["usable_cores"] == (os.cpu_count() or 1)  # no affinity call: every core
    for fmt in ("lmdb", "hdf5", "wds"):
        assert got[fmt]["written"] == 64
        ref = [list(b) for b in _batches(tmp_path, fmt)]
        assert len(ref) == 8 and got[fmt]["batches"] == ref, fmt
    # the remote-data cache's shared locks are POSIX's: refused, saying so
    assert "needs POSIX file locks (fcntl), which this system lacks" in got["cache"]


def test_a_parameterized_hint_is_no_class():
    """Python 3.10 takes ``dict[str, Any]`` for a class (3.11 does not), and isinstance refuses
    it: the option checks raised TypeError there for every make_loader call (storage_options).
    Such a hint accepts any value, as on 3.11; run on 3.10, this failed before."""
    assert conforms({"anon": True}, dict[str, Any] | None) and conforms(None, dict[str, Any])
    assert conforms([1], list[int]) and not conforms("a", int | None)


def test_the_hiding_is_real():
    """The probe's site hook hides fcntl and resource from feedpipe's modules only, and the
    Linux-only calls from everyone."""
    code = ("import os, signal\n"
            "for importer in ('feedpipe.x', 'converters.x', 'numpy.x'):\n"
            "    for name in ('fcntl', 'resource'):\n"
            "        try:\n"
            "            exec(f'import {name}', {'__name__': importer})\n"
            "            print(importer, name, 'imported')\n"
            "        except ImportError:\n"
            "            print(importer, name, 'hidden')\n"
            "print(hasattr(os, 'sched_getaffinity'), hasattr(signal, 'pthread_sigmask'))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(TESTS / "platform_site"),
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("\n") == [
        "feedpipe.x fcntl hidden", "feedpipe.x resource hidden", "converters.x fcntl hidden",
        "converters.x resource hidden", "numpy.x fcntl imported", "numpy.x resource imported",
        "False False", ""], proc.stderr


def _can_mount() -> bool:
    """Whether a private mount namespace with its own tmpfs can be made here (root, or
    a container allowing it)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount(), reason="needs unshare and mount (root): a private /dev/shm")
def test_small_dev_shm_falls_back_and_names_the_page(packed, tmp_path):
    """Docker's 64 MB /dev/shm, scaled down: with 8 MiB, the loader's batch ring does not fit.
    The loader warns, naming docs/containers.md, gives each batch fresh shared memory, and serves
    the very batches it serves with room to spare (here, without workers)."""
    report = tmp_path / "report.json"
    script = ("mount -t tmpfs -o size=8m tmpfs /dev/shm && "
              f"exec {sys.executable} {TESTS / 'shm_probe.py'} {packed['lmdb']} {report}")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], env=_env(TESTS),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(report.read_text())
    assert got["shm"] == 8 << 20  # the probe ran in the small /dev/shm
    ring = [w for w in got["warnings"] if "batch ring" in w]
    assert len(ring) == 1 and "/dev/shm has 8 MiB free" in ring[0], got["warnings"]
    assert "docs/containers.md" in ring[0]
    assert len(got["batches"]) == 4 and got["batches"] == shm_probe.batches(packed["lmdb"], 0)
