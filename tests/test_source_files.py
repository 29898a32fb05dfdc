"""What a conversion source may make feedpipe read.

A manifest row (or its mask, or ``--coco``/``--mask-palette``) naming a FIFO blocked the
conversion forever, and one naming ``/dev/zero`` read until the OOM killer: folder walks took
regular files only, manifest rows anything. Now every such file is opened non-blocking and refused
unread when it is not a regular file. Those runs happen in a child process with a timeout and a
memory cap, so the old behaviour fails here instead of hanging or exhausting the machine.

Rows naming files outside the manifest's folder (``..``, absolute paths, symlinks leading out) are
read by default, as the docs say (docs/sources.md); ``contained=True`` (``--contained``) refuses
each by name.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import CLI
from PIL import Image

import feedpipe
from converters import convert
from feedpipe.errors import BadInputError

LIMIT = 60  # seconds; a FIFO blocked forever
MEMORY = 3 << 30  # bytes of address space for the child: /dev/zero grew to the OOM killer


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([*CLI, "convert", *map(str, args)], capture_output=True, text=True,
                              timeout=LIMIT, preexec_fn=_capped)
    except subprocess.TimeoutExpired:
        pytest.fail(f"convert {args[0]}: still blocked after {LIMIT} s")


@pytest.fixture
def src(tmp_path, photos) -> Path:
    """A folder with two photos (a.jpg, b.jpg), their masks, a FIFO and a sub-folder."""
    root = tmp_path / "src"
    root.mkdir()
    for name, p in zip("ab", photos, strict=False):
        shutil.copyfile(p.path, root / f"{name}.jpg")
        with Image.open(p.path) as im:
            Image.new("L", im.size).save(root / f"{name}.png")
    os.mkfifo(root / "pipe.jpg")
    (root / "folder.jpg").mkdir()
    return root


def test_rows_naming_a_fifo_a_device_or_a_folder_are_skipped_unread(tmp_path, src):
    rows = ["path", "a.jpg", "pipe.jpg", "/dev/zero", "folder.jpg", "b.jpg"]
    (src / "list.csv").write_text("\n".join(rows) + "\n")
    proc = _cli(src / "list.csv", "--to", "lmdb", "-o", tmp_path / "o", "--workers", "0", "-q")
    assert proc.returncode == 0, proc.stderr
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert [s["path"] for s in ds.read_raw_batch(range(len(ds)))] == ["a.jpg", "b.jpg"]
    skipped = {s["path"]: s["reason"] for s in ds.manifest.skipped}
    assert skipped == {"pipe.jpg": "a FIFO (named pipe), not a regular file (refused unread)",
                       "/dev/zero": "a character device, not a regular file (refused unread)",
                       "folder.jpg": "a folder, not a regular file (refused unread)"}


@pytest.mark.parametrize("palette", [[], ["--mask-palette", "auto"]], ids=["index", "auto"])
def test_a_mask_row_naming_a_fifo_is_skipped_unread(tmp_path, src, palette):
    """Also where ``mask_palette="auto"`` reads every mask first, to count its colours."""
    rows = ["path,mask", "a.jpg,a.png", "b.jpg,pipe.jpg"]
    (src / "seg.csv").write_text("\n".join(rows) + "\n")
    proc = _cli(src / "seg.csv", "--to", "hdf5", "-o", tmp_path / "o", "--workers", "0", "-q",
                *palette)
    assert proc.returncode == 0, proc.stderr
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert len(ds) == 1 and ds.manifest.skipped[0] == {
        "path": "b.jpg", "reason": "mask pipe.jpg: a FIFO (named pipe), not a regular file "
                                   "(refused unread)"}


@pytest.mark.parametrize("option", ["--coco", "--mask-palette"])
def test_a_fifo_as_coco_or_palette_file_is_refused_in_one_line(tmp_path, src, option):
    extra = ["--masks", src] if option == "--mask-palette" else []
    proc = _cli(src, "--to", "wds", "-o", tmp_path / "o", "--workers", "0", "-q", option,
                src / "pipe.jpg", *extra)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert f"{src / 'pipe.jpg'}: a FIFO (named pipe), not a regular file" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.fixture
def escaping(tmp_path, photos) -> Path:
    """A manifest in ``data/`` whose rows name an inside photo, ``../secret/x.jpg``, an
    absolute path, and a symlink inside ``data/`` leading to the secret folder."""
    data, secret = tmp_path / "data", tmp_path / "secret"
    (data / "sub").mkdir(parents=True)
    secret.mkdir()
    shutil.copyfile(photos[0].path, data / "in.jpg")
    shutil.copyfile(photos[1].path, secret / "x.jpg")
    os.symlink(secret / "x.jpg", data / "link.jpg")
    rows = [{"path": "in.jpg"}, {"path": "../secret/x.jpg"}, {"path": str(secret / "x.jpg")},
            {"path": "link.jpg"}, {"path": "sub/../in.jpg"}]
    (data / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data / "list.jsonl"


def test_rows_outside_the_folder_are_read_by_default(tmp_path, escaping):
    res = convert(escaping, tmp_path / "o", to="lmdb", workers=0)
    assert res.written == 5 and not res.ignored_files


def test_contained_refuses_each_row_that_leads_outside(tmp_path, escaping):
    res = convert(escaping, tmp_path / "o", to="lmdb", workers=0, contained=True)
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert [s["path"] for s in ds.read_raw_batch(range(len(ds)))] == ["in.jpg", "sub/../in.jpg"]
    secret = escaping.parent.parent / "secret"
    assert res.ignored_files == [
        {"path": "list.jsonl:2", "reason": "path '../secret/x.jpg': '..' leads outside the "
                                           "source folder"},
        {"path": "list.jsonl:3", "reason": f"path '{secret}/x.jpg': an absolute path, outside "
                                           "the source folder"},
        {"path": "list.jsonl:4", "reason": "path 'link.jpg': a symlink leads outside the source "
                                           f"folder (to {secret}/x.jpg)"}]
    assert ds.manifest.conversion["contained"] is True
    with pytest.raises(BadInputError, match=r"list\.jsonl:2: path '\.\./secret/x\.jpg'"):
        convert(escaping, tmp_path / "s", to="lmdb", workers=0, contained=True, strict=True)


def test_contained_from_the_cli_and_for_folders_arrays_and_coco(tmp_path, escaping, photos):
    data = escaping.parent
    proc = _cli(escaping, "--to", "wds", "-o", tmp_path / "o", "--workers", "0", "-q",
                "--contained")
    assert proc.returncode == 0, proc.stderr
    assert len(feedpipe.open_dataset(tmp_path / "o")) == 2
    # a folder source: the symlink leading out is refused by name, the photo taken
    (data / "list.jsonl").unlink()
    res = convert(data, tmp_path / "f", to="lmdb", workers=0, contained=True)
    assert res.written == 1 and res.ignored_files[0]["path"] == "link.jpg"
    assert "a symlink leads outside the source folder" in res.ignored_files[0]["reason"]
    # a manifest's .npy array column
    np.save(data.parent / "outside.npy", np.arange(3))
    np.save(data / "inside.npy", np.arange(3))
    (data / "arr.csv").write_text("path,emb\nin.jpg,inside.npy\nin.jpg,../outside.npy\n")
    from converters.columns import LabelColumns
    res = convert(data / "arr.csv", tmp_path / "a", to="lmdb", workers=0, contained=True,
                  columns=LabelColumns(arrays=("emb",)))
    assert res.written == 1
    assert res.ignored_files == [{"path": "in.jpg", "reason": "manifest line 3: column 'emb': "
                                  "../outside.npy: '..' leads outside the source folder"}]
    # COCO file names
    coco = {"images": [{"id": 1, "file_name": "in.jpg"}, {"id": 2, "file_name": "../secret/x.jpg"}],
            "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    (tmp_path / "instances.json").write_text(json.dumps(coco))
    res = convert(data, tmp_path / "c", to="lmdb", workers=0, coco=tmp_path / "instances.json",
                  contained=True)
    assert res.written == 1 and res.ignored_files[0]["path"] == "../secret/x.jpg"


def test_an_image_manifest_never_drops_a_column_or_a_value(tmp_path, src):
    (src / "twice.csv").write_text("path,note,note\na.jpg,x,y\n")
    with pytest.raises(BadInputError,
                       match=r"the header names 'note' \(columns 2, 3\) more than once"):
        convert(src / "twice.csv", tmp_path / "o", to="lmdb", workers=0)
    (src / "ragged.csv").write_text("path,note\na.jpg,x,lost\nb.jpg,y\n\na.jpg\n")
    res = convert(src / "ragged.csv", tmp_path / "r", to="lmdb", workers=0)
    assert res.written == 1 and res.ignored_files == [
        {"path": "ragged.csv:2", "reason": "3 cells, the header has 2"},
        {"path": "ragged.csv:5", "reason": "1 cells, the header has 2"}]
    (src / "twice.jsonl").write_text('{"path": "a.jpg", "note": 1, "note": 2}\n'
                                     '{"path": "b.jpg", "note": 3}\n')
    res = convert(src / "twice.jsonl", tmp_path / "j", to="lmdb", workers=0)
    assert res.written == 1 and res.ignored_files == [
        {"path": "twice.jsonl:1", "reason": "key 'note' is given twice in this object (one "
                                            "value would be lost)"}]
