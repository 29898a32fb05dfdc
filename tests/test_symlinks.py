"""Symlinks (and hard links) planted under the names feedpipe writes must never lead a write
outside the folder: ``feedpipe index`` and ``merge`` write through a fresh ``mkstemp`` file, the
output lock refuses a link by name."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import cli_main
from PIL import Image

import feedpipe
from converters import convert
from converters.merge import merge
from converters.parts import Part
from converters.wds_index import index_shards
from feedpipe.dataset.formats.wds import CRC_FILE, INDEX_FILES
from feedpipe.dataset.verify import verify
from feedpipe.errors import BadInputError

wds = pytest.importorskip("webdataset")
VICTIM = b"precious: not feedpipe's\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    return victim


def _plant(folder: Path, names: list[str], victim: Path) -> None:
    for name in names:
        os.symlink(os.path.relpath(victim, folder), folder / name)


def _shards(root: Path) -> Path:
    root.mkdir()
    with wds.TarWriter(str(root / "train-000.tar")) as w:
        for i in range(4):
            png = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(png, "PNG")
            w.write({"__key__": f"k{i}", "png": png.getvalue(), "cls": i})
    return root


def test_index_never_writes_through_planted_temp_names(capsys, tmp_path):
    root = _shards(tmp_path / "shards")
    victim = _victim(tmp_path)
    names = [*INDEX_FILES, CRC_FILE]
    # the old fixed temp names, and an index file itself (the link is replaced, never its target)
    _plant(root, [f".{n}.tmp" for n in names] + [INDEX_FILES[0]], victim)
    rc, out, err = cli_main(capsys, "index", root)
    assert rc == 0, err
    assert victim.read_bytes() == VICTIM
    assert not any((root / n).is_symlink() for n in names)
    ds = feedpipe.open_dataset(root)
    assert [ds[i]["label"] for i in range(len(ds))] == [0, 1, 2, 3]
    assert verify(root).ok
    index_shards(root, overwrite=True)  # again, over its own files: the links still in place
    assert victim.read_bytes() == VICTIM and verify(root).ok


@pytest.mark.parametrize("fmt", ["wds", "hdf5"])
def test_merge_never_writes_through_planted_temp_names(photo_dir, tmp_path, fmt):
    out = tmp_path / "merged"
    opts = {"shard_count": 20} if fmt == "wds" else None
    for i in range(2):
        convert(photo_dir, out, to=fmt, workers=0, writer_options=opts, part=Part(i, 2))
    victim = _victim(tmp_path)
    names = [*INDEX_FILES, CRC_FILE] if fmt == "wds" else ["data.h5"]
    _plant(out, [f".{n}.tmp" for n in names], victim)
    res = merge(out)
    assert res.num_samples == 72
    assert victim.read_bytes() == VICTIM
    assert verify(out).ok


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_output_lock_refuses_a_planted_link(capsys, photo_dir, tmp_path, how):
    """``.<out>.lock`` is truncated and written by convert and merge: a link planted there (to
    a file the user can write) is refused by name, its target untouched."""
    victim = _victim(tmp_path)
    dest = tmp_path / "dest"
    for i in range(2):
        convert(photo_dir, dest / "merged", to="lmdb", workers=0, part=Part(i, 2))
    for name in ("out", "merged"):
        lock = dest / f".{name}.lock"
        os.symlink(victim, lock) if how == "symlink" else os.link(victim, lock)
    rc, out, err = cli_main(capsys, "convert", photo_dir, "--to", "lmdb", "-o", dest / "out",
                            "--workers", "0", "-q")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert str(dest / ".out.lock") in err and "lock file" in err
    assert not (dest / "out").exists()
    with pytest.raises(BadInputError, match="merged.lock: the lock file"):
        merge(dest / "merged")
    assert victim.read_bytes() == VICTIM
