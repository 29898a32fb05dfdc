"""What a conversion may touch: --overwrite replaces a feedpipe dataset only, never the source or a
user's folder, and an empty result is an error that says why and leaves nothing behind."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from conftest import N_PHOTOS
from fp_helpers import run_cli

import feedpipe
from converters import convert
from converters.swap import MARKER
from feedpipe.dataset.verify import verify
from feedpipe.errors import BadInputError


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` → SHA-256, to show a folder was left untouched."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def src(tmp_path, photo_dir) -> Path:
    """A private copy of the photo tree: these tests point outputs at it."""
    return Path(shutil.copytree(photo_dir, tmp_path / "imgs"))


@pytest.mark.parametrize("where", ["same", "inside", "parent", "symlink"])
def test_overwrite_never_touches_the_source(tmp_path, src, where):
    before = tree_digest(src)
    out = {"same": src, "inside": src / "packed", "parent": tmp_path, "symlink": tmp_path / "ln"}
    if where == "symlink":
        os.symlink(src, out["symlink"])
    proc = run_cli("convert", src, "--to", "lmdb", "-o", out[where], "--overwrite", "-q")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "source" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert tree_digest(src) == before  # not one file lost or added
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["imgs"] + ["ln"] * (where ==
                                                                                  "symlink"))


def test_overwrite_refuses_a_folder_feedpipe_did_not_make(tmp_path, photo_dir):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("thesis draft")
    (mine / "data.mdb").write_bytes(b"my own lmdb")  # a feedpipe file name is not enough
    with pytest.raises(BadInputError, match=r"not a feedpipe dataset \(it holds data.mdb, "
                                                 r"notes.txt\)"):
        convert(photo_dir, mine, to="lmdb", workers=0, overwrite=True)
    assert sorted(p.name for p in mine.iterdir()) == ["data.mdb", "notes.txt"]
    proc = run_cli("convert", photo_dir, "--to", "lmdb", "-o", mine, "--overwrite", "-q")
    assert proc.returncode == 2 and "notes.txt" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no lock or partial left


def test_overwrite_refuses_a_dataset_holding_user_files(tmp_path, photo_dir):
    out = tmp_path / "out"
    convert(photo_dir, out, to="wds", workers=0, writer_options={"shard_count": 20})
    (out / "my_results.csv").write_text("epoch,acc\n")
    with pytest.raises(BadInputError, match="did not make \\(my_results.csv\\)"):
        convert(photo_dir, out, to="lmdb", workers=0, overwrite=True)
    assert (out / "my_results.csv").exists() and verify(out).ok


def test_overwrite_replaces_datasets_and_splits(tmp_path, photo_dir):
    out = tmp_path / "out"
    convert(photo_dir, out, to="hdf5", workers=0, val_fraction=0.25)
    res = convert(photo_dir, out, to="lmdb", workers=0, overwrite=True)  # a split is ours too
    assert res.written == N_PHOTOS and len(feedpipe.open_dataset(out)) == N_PHOTOS
    convert(photo_dir, out, to="wds", workers=0, overwrite=True, val_fraction=0.5)
    assert {p.name for p in out.iterdir()} == {"train", "val"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    (tmp_path / "empty").mkdir()  # an empty folder holds nothing to lose
    assert convert(photo_dir, tmp_path / "empty", to="lmdb", workers=0,
                   overwrite=True).written == N_PHOTOS


def test_leftovers_are_removed_only_when_feedpipe_made_them(tmp_path, photo_dir):
    out = tmp_path / "out"
    partial = tmp_path / ".out.partial"
    partial.mkdir()
    (partial / MARKER).write_text("{}")
    (partial / "data.mdb").write_bytes(b"half")
    convert(photo_dir, out, to="lmdb", workers=0)  # a leftover with feedpipe's marker: cleared
    assert not partial.exists()
    partial.mkdir()
    (partial / "holiday.jpg").write_bytes(b"a user's file that happens to sit there")
    with pytest.raises(BadInputError, match="holiday.jpg"):
        convert(photo_dir, out, to="lmdb", workers=0, overwrite=True)
    assert (partial / "holiday.jpg").exists() and verify(out).ok


def test_manifest_source_folder_rules(tmp_path, photos):
    images = tmp_path / "images"
    images.mkdir()
    for p in photos[:8]:
        shutil.copyfile(p.path, images / p.path.name)
    csv = tmp_path / "list.csv"
    csv.write_text("path\n" + "".join(f"images/{p.path.name}\n" for p in photos[:8]))
    with pytest.raises(BadInputError, match="folder of the source manifest"):
        convert(csv, tmp_path, to="lmdb", workers=0, overwrite=True)
    with pytest.raises(BadInputError, match="lies inside the source"):
        convert(csv, images / "packed", to="lmdb", workers=0)
    # beside the manifest, outside every image folder: fine
    assert convert(csv, tmp_path / "packed", to="lmdb", workers=0).written == 8


def _shards(tmp_path: Path, packed: dict[str, Path]) -> Path:
    d = tmp_path / "shards"
    d.mkdir()
    for f in sorted(packed["wds"].glob("*.tar")):
        shutil.copyfile(f, d / f.name)
    return d


@pytest.mark.parametrize("case, why", [
    ("shards", "looks like WebDataset shards; `feedpipe convert"),
    ("dataset", "is already a packed dataset"),
    ("csv", "8 of 8 listed paths do not exist"),
    ("broken", "all 3 inputs were skipped: a.jpg: "),
])
def test_zero_samples_is_an_error_that_says_why(tmp_path, packed, case, why):
    if case == "shards":
        src = _shards(tmp_path, packed)
    elif case == "dataset":
        src = Path(shutil.copytree(packed["lmdb"], tmp_path / "ds"))
    elif case == "csv":
        src = tmp_path / "list.csv"
        src.write_text("path,label\n" + "".join(f"gone/{i}.jpg,{i % 2}\n" for i in range(8)))
    else:
        src = tmp_path / "broken"
        src.mkdir()
        for name in "abc":
            (src / f"{name}.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(BadInputError, match="wrote 0 samples") as err:
        convert(src, tmp_path / "out", to="lmdb", workers=0)
    assert why in str(err.value)
    if case == "shards":  # the CLI packs foreign shards (converters.foreign_wds)
        assert run_cli("convert", src, "--to", "wds", "-o", tmp_path / "out", "-q").returncode == 0
        assert len(feedpipe.open_dataset(tmp_path / "out")) == len(feedpipe.open_dataset(packed["wds"]))
        return
    proc = run_cli("convert", src, "--to", "wds", "-o", tmp_path / "out", "-q")
    assert proc.returncode == 2 and why in proc.stderr, proc.stdout + proc.stderr
    assert "wrote 0 samples" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing left on disk
