"""After a worker raised CorruptRecordError, the next loader printed "AssertionError:
can only test a child process" once per worker: the failed epoch's DataLoader iterator, kept in
a reference cycle by the exception's traceback, was freed inside the next loader's forked
workers. The torch backend now stops a failed epoch's workers itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fp_helpers import put_hdf5_value  # noqa: E402
from test_errors import pack  # noqa: E402

pytestmark = pytest.mark.heavy  # two loaders with worker processes in a fresh interpreter

SCRIPT = textwrap.dedent("""
    import sys

    import feedpipe
    from feedpipe.errors import CorruptRecordError
    kw = dict(size=16, shuffle=False, num_workers=2,
              output=feedpipe.Output(dtype="uint8", mean=None, std=None),
              device="cpu")

    def first():
        try:
            list(feedpipe.make_loader(sys.argv[1], 4, fields=("image", "label", "path"), **kw))
        except CorruptRecordError as e:
            err = e  # exception -> traceback -> this frame -> err: a cycle only gc frees
            return "raised" if err else ""

    import gc
    import os
    gc.disable()  # the cycle stays garbage in this process until the next loader forks...
    print(first())
    os.register_at_fork(after_in_child=gc.collect)  # ...and a worker collects it at once
    print(sum(len(b["label"]) for b in feedpipe.make_loader(sys.argv[1], 4, fields=("image", "label"), **kw)))
""")


def test_next_loader_after_a_worker_error_prints_nothing(tmp_path):
    root = pack("hdf5", tmp_path / "ds", 16)
    put_hdf5_value(root, "path", 5, b"{not json")  # a damaged record whose checksum matches
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(root)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["raised", "16"]
    assert "AssertionError" not in proc.stderr and "Exception ignored" not in proc.stderr, \
        proc.stderr
