"""Open files under a low descriptor limit (``RLIMIT_NOFILE``, as ``ulimit -n``): a 300-shard
WebDataset verifies and loads whole under ``ulimit -n 200`` (each process keeps at most
``max_open_shards`` shards open); where the limit is too low even for that, "too many open
files" is raised as a ResourceError, never reported as damage nor skipped; and the descriptor
count of a process stays flat over create/epoch/drop cycles with real DataLoader workers."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fp_helpers import CLI, REMOTE_KW, batch_digests, loader_batches

import feedpipe
from converters import convert
from converters.synth import make_photos
from feedpipe import Workers

pytestmark = pytest.mark.heavy

PROBE = """
import json, os, resource, sys
import feedpipe
from feedpipe.dataset.verify import verify
from feedpipe import Workers
from feedpipe.errors import ResourceError
from fp_helpers import REMOTE_KW, batch_digests, loader_batches
path, limit, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
limit = limit or len(os.listdir("/proc/self/fd")) + 8  # 0: just above what is open now
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
out = {}
for name, run in [("verify", lambda: verify(path)),
                  ("load", lambda: loader_batches(path, **{**REMOTE_KW, "num_workers": workers},
                                                  workers=Workers(on_error="skip"),
                                                  shuffle=True))]:
    try:
        got = run()
        out[name] = got.problems if name == "verify" else batch_digests(got)
    except ResourceError as exc:
        out[name] = f"ResourceError: {exc}"
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> Path:
    """600 small photos in 300 WebDataset shards."""
    root = tmp_path_factory.mktemp("shards300")
    make_photos(root / "src", 600, size=(32, 24), classes=3, seed=0)
    convert(root / "src", root / "ds", to="wds", workers=0, writer_options={"shard_count": 2})
    assert len(feedpipe.open_dataset(root / "ds").shards) == 300
    return root / "ds"


def probe(path: Path, limit: int, workers: int) -> dict[str, object]:
    tests = str(Path(__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", PROBE, str(path), str(limit), str(workers)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_300_shards_under_ulimit_200(many_shards):
    """verify finds nothing wrong (it reported 218 records DAMAGED: EMFILE), and a shuffled
    epoch with on_error="skip" and 2 workers is the unlimited one, sample for sample (334 of
    600 were substitutes)."""
    want = batch_digests(loader_batches(many_shards, **{**REMOTE_KW, "num_workers": 0},
                                        workers=Workers(on_error="skip"), shuffle=True))
    got = probe(many_shards, 200, 2)
    assert got["verify"] == []
    assert got["load"] == want and len(want) == 75


def test_too_few_descriptors_raise_not_skip(many_shards):
    """A limit below what even one reader needs: both raise ResourceError naming the shard and
    the limit, instead of reporting damage or serving substitutes; the CLI says so too."""
    got = probe(many_shards, 0, 0)
    for name in ("verify", "load"):
        assert isinstance(got[name], str), got[name]
        assert got[name].startswith("ResourceError: ") and "Too many open files" in got[name]
        assert "shard-" in got[name] and "ulimit -n" in got[name]

    def low_limit() -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))

    r = subprocess.run([*CLI, "verify", str(many_shards)], capture_output=True, text=True,
                       timeout=300, preexec_fn=low_limit)
    assert r.returncode != 0 and "Too many open files" in r.stdout + r.stderr
    assert "DAMAGED" not in r.stdout + r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("workers", [0, 2])
def test_descriptors_flat_over_create_epoch_drop_cycles(photo_dir, tmp_path, workers):
    """18 shards, 20 cycles of make_loader / one epoch / drop: the process ends with the
    descriptors it started with (each cycle left 18 open with num_workers=0)."""
    convert(photo_dir, tmp_path / "ds", to="wds", workers=0, writer_options={"shard_count": 4})
    assert len(feedpipe.open_dataset(tmp_path / "ds").shards) == 18
    gc.collect()
    start = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        loader = feedpipe.make_loader(tmp_path / "ds", 8, **{**REMOTE_KW, "num_workers": workers})
        assert sum(len(b["label"]) for b in loader) == 72
        del loader
        gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= start
