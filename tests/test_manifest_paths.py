"""A manifest never leads feedpipe outside its dataset: names with '..', absolute paths,
separators and escaping symlinks are refused by Manifest.read, before any file is opened.

An audit hook records every Python-level open of the outside file (``open``, ``os.open``,
``np.load``), so "never touched" is observed, not assumed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import feedpipe
from feedpipe.dataset.formats.wds import WdsReader
from feedpipe.dataset.manifest import MANIFEST_NAME
from feedpipe.dataset.verify import verify
from feedpipe.errors import DamagedDataError
from feedpipe.loader.dali.index import DaliIndex

_WATCHED: set[str] = set()
_TOUCHED: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _WATCHED and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if os.path.realpath(path) in _WATCHED:  # through any symlink
            _TOUCHED.append(path)


sys.addaudithook(_audit)  # hooks cannot be removed; it only records while _WATCHED is set


@pytest.fixture
def watched(tmp_path):
    """An outside directory holding ``outside.tar``; yields it and the opens seen of it."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _WATCHED.clear()
    _TOUCHED.clear()
    yield outside, _TOUCHED
    _WATCHED.clear()


def _edit(root: Path, change) -> None:
    path = root / MANIFEST_NAME
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d))


def _everything(root: Path) -> list[str]:
    """Every way feedpipe reads a dataset: open, load a batch, verify, the DALI index."""
    errors = []
    for attempt in (lambda: feedpipe.open_dataset(root)[0],
                    lambda: next(iter(feedpipe.make_loader(root, 4, size=32, num_workers=0,
                                                           device="cpu"))),
                    lambda: verify(root)):
        with pytest.raises(DamagedDataError) as info:
            attempt()
        errors.append(str(info.value))
    with pytest.raises(DamagedDataError):
        DaliIndex(WdsReader(root)).paths()  # the writer of index files next to the shards
    return errors


@pytest.mark.parametrize("bad", ["../../elsewhere/outside.tar", "ABS", "..", "a\\b.tar", "",
                                 "sub/../shard-000001.tar", "./shard-000001.tar",
                                 "sub//shard-000001.tar", "sub/", "LINK"])
def test_bad_shard_names_are_refused_before_any_open(packed, copy_dataset, watched, bad):
    outside, touched = watched
    shutil.copy(packed["wds"] / "shard-000000.tar", outside / "outside.tar")
    root = copy_dataset(packed["wds"])
    name = str(outside / "outside.tar") if bad == "ABS" else bad
    if bad.startswith("../"):
        name = os.path.relpath(outside / "outside.tar", root)
    if bad == "LINK":  # a relative sub-path through a folder symlinked outside
        (root / "sub").symlink_to(outside)
        name = "sub/outside.tar"
    _WATCHED.add(os.path.realpath(outside / "outside.tar"))

    def change(d):
        d["files"][0]["name"] = name
        d["extra"]["shards"][0] = name

    _edit(root, change)
    for msg in _everything(root):
        assert "files[0].name" in msg and repr(name) in msg
    assert touched == []
    assert sorted(p.name for p in outside.iterdir()) == ["outside.tar"]  # no outside.idx


def test_shard_list_alone_is_checked(packed, copy_dataset, watched):
    """extra.shards is what the WebDataset reader and the DALI index open: checked by itself."""
    outside, touched = watched
    shutil.copy(packed["wds"] / "shard-000001.tar", outside / "outside.tar")
    root = copy_dataset(packed["wds"])
    name = os.path.relpath(outside / "outside.tar", root)
    _WATCHED.add(os.path.realpath(outside / "outside.tar"))
    _edit(root, lambda d: d["extra"]["shards"].__setitem__(1, name))
    for msg in _everything(root):
        assert "extra.shards[1]" in msg
    assert touched == [] and sorted(p.name for p in outside.iterdir()) == ["outside.tar"]


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_escaping_symlink_is_refused(packed, copy_dataset, watched, fmt):
    """A data file replaced by a symlink to a file outside the dataset is refused, whether the
    manifest lists it (files[]) or the reader opens it by its fixed name."""
    outside, touched = watched
    root = copy_dataset(packed[fmt])
    name = {"lmdb": "data.mdb", "hdf5": "data.h5", "wds": "index-keys.npy"}[fmt]
    shutil.move(root / name, outside / name)
    (root / name).symlink_to(outside / name)
    _WATCHED.add(os.path.realpath(outside / name))
    for msg in _everything(root):
        assert "symlink" in msg and repr(name) in msg and str(outside / name) in msg
    assert touched == []


def test_symlink_inside_the_dataset_is_fine(packed, copy_dataset):
    """A symlink that stays inside the dataset (e.g. shards moved to a sub-folder) still opens."""
    root = copy_dataset(packed["wds"])
    (root / "moved").mkdir()
    shutil.move(root / "shard-000000.tar", root / "moved" / "shard-000000.tar")
    (root / "shard-000000.tar").symlink_to(Path("moved") / "shard-000000.tar")
    ds = feedpipe.open_dataset(root)
    assert len(ds) == 72 and ds[0]["image"].ndim == 3
    assert verify(root, decode=False).ok


def test_symlink_loop_and_non_list_shards_are_typed(packed, copy_dataset):
    root = copy_dataset(packed["wds"])
    (root / "shard-000002.tar").unlink()
    (root / "shard-000002.tar").symlink_to("shard-000002.tar")
    with pytest.raises(DamagedDataError, match="shard-000002.tar"):
        feedpipe.open_dataset(root)
    root2 = copy_dataset(packed["wds"], "other")
    _edit(root2, lambda d: d["extra"].__setitem__("shards", "shard-000000.tar"))
    with pytest.raises(DamagedDataError, match="extra.shards"):
        feedpipe.open_dataset(root2)


def test_planted_dali_index_symlink_is_replaced_not_followed(packed, copy_dataset, watched):
    """An index file planted as a symlink to an outside file is neither read nor written
    through: a regular index takes its place."""
    outside, touched = watched
    target = outside / "victim.txt"
    target.write_text("keep me\n")
    root = copy_dataset(packed["wds"])
    (root / "shard-000000.idx").symlink_to(target)
    _WATCHED.add(os.path.realpath(target))
    paths = DaliIndex(WdsReader(root)).paths()
    assert touched == []
    _WATCHED.clear()  # the checks below read it themselves
    assert paths[0] == root / "shard-000000.idx" and not paths[0].is_symlink()
    assert paths[0].read_text().startswith("v1.2 ")
    assert target.read_text() == "keep me\n"


def test_relative_sub_paths_inside_are_allowed(packed, copy_dataset):
    """A merged dataset names its parts' files as ``parts/.../file``: allowed inside."""
    root = copy_dataset(packed["wds"])
    (root / "parts" / "p0").mkdir(parents=True)
    shutil.move(root / "shard-000000.tar", root / "parts" / "p0" / "shard-000000.tar")

    def change(d):
        d["files"][0]["name"] = d["extra"]["shards"][0] = "parts/p0/shard-000000.tar"

    _edit(root, change)
    ds = feedpipe.open_dataset(root)
    assert len(ds) == 72 and ds[0]["image"].ndim == 3
    assert verify(root, decode=False).ok
