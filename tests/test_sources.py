"""What the converter takes from a folder: class folders win, and every file not taken is named."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import N_PHOTOS
from fp_helpers import pil_rgb
from PIL import Image

import feedpipe
from converters import convert, scan
from feedpipe.cli import main
from feedpipe.dataset.manifest import Manifest
from feedpipe.errors import BadInputError

STRAY = "README_example.jpg"


@pytest.fixture
def tree_with_stray(tmp_path, photo_dir, photos) -> Path:
    """The test run's ImageFolder tree plus one stray image at its root."""
    src = tmp_path / "src"
    shutil.copytree(photo_dir, src)
    (src / STRAY).write_bytes(photos[0].path.read_bytes())
    return src


def test_stray_root_image_keeps_every_label(tmp_path, tree_with_stray, photos, photo_classes):
    res = convert(tree_with_stray, tmp_path / "o", to="lmdb", workers=0)
    assert res.written == N_PHOTOS
    assert res.ignored_files[0]["path"] == STRAY
    assert "class folders" in res.ignored_files[0]["reason"]
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert ds.schema.names == ["image", "label", "path"]
    assert ds.manifest.classes == photo_classes
    assert [s["label"] for s in ds.read_raw_batch(range(len(ds)))] == [p.label for p in photos]
    assert ds.manifest.conversion["source_kind"] == "imagefolder"
    assert ds.manifest.conversion["ignored"] == res.ignored_files


def test_stray_root_image_under_strict_or_flat(tmp_path, tree_with_stray):
    with pytest.raises(BadInputError, match=STRAY):
        convert(tree_with_stray, tmp_path / "o", to="wds", workers=0, strict=True)
    assert not (tmp_path / "o").exists()
    assert main(["convert", str(tree_with_stray), "--to", "wds", "-o", str(tmp_path / "f"), "-q",
                 "--workers", "0", "--layout", "flat", "--max-pixels", "100000"]) == 0
    ds = feedpipe.open_dataset(tmp_path / "f")
    assert len(ds) == N_PHOTOS + 1 and not ds.manifest.conversion["ignored"]
    assert ds.schema.names == ["image", "path"] and ds.manifest.conversion["max_pixels"] == 100_000


def test_cli_summary_names_files_not_taken(tmp_path, tree_with_stray, capsys):
    (tree_with_stray / "astronaut" / "notes.txt").write_text("not an image")
    assert main(["convert", str(tree_with_stray), "--to", "hdf5", "-o", str(tmp_path / "o"),
                 "-q", "--workers", "0"]) == 0
    out = capsys.readouterr().out
    assert f"not taken {STRAY}: outside the class folders" in out
    assert "not taken astronaut/notes.txt: not an image" in out
    assert f"stored: jpeg unchanged {N_PHOTOS}" in out


def jp2_pnm_tree(root: Path, photos) -> dict[str, np.ndarray]:
    """Class 'b' holds only JPEG 2000 and PNM files (once skipped, leaving 'b' empty)."""
    expect = {}
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    shutil.copy(photos[0].path, root / "a" / "x.jpg")
    img = Image.open(photos[1].path).convert("RGB")
    img.save(root / "b" / "lossless.jp2", irreversible=False)
    img.save(root / "b" / "photo.pnm")
    for name in ("b/lossless.jp2", "b/photo.pnm"):
        expect[name] = pil_rgb(root / name)
    return expect


def test_jpeg2000_and_pnm_are_converted_losslessly(tmp_path, photos):
    expect = jp2_pnm_tree(tmp_path / "src", photos)
    res = convert(tmp_path / "src", tmp_path / "o", to="wds", workers=0)
    assert res.written == 3 and not res.skipped and not res.empty_classes
    assert res.stored == {"jpeg unchanged": 1, "jp2→png": 1, "pnm→png": 1}
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert ds.schema["image"].codec == "mixed"
    got = {s["path"]: s for s in ds}
    for name, ref in expect.items():
        assert got[name]["label"] == 1
        assert np.array_equal(got[name]["image"], ref), name  # decoded pixels kept exactly


def test_class_left_empty_warns_and_fails_under_strict(tmp_path, photos, caplog):
    src = tmp_path / "src"
    for cls in ("a", "b", "c"):
        (src / cls).mkdir(parents=True)
    shutil.copy(photos[0].path, src / "a" / "x.jpg")
    (src / "b" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    (src / "c" / "readme.txt").write_text("no images here")
    with caplog.at_level(logging.WARNING, logger="feedpipe.convert"):
        res = convert(src, tmp_path / "o", to="lmdb", workers=0)
    assert res.empty_classes == ["b", "c"]
    assert "b, c" in caplog.text
    m = Manifest.read(tmp_path / "o")
    assert m.classes == ("a", "b", "c")  # label indices stay those of the folders
    assert m.conversion["empty_classes"] == ["b", "c"]
    (src / "b" / "broken.jpg").unlink()
    with pytest.raises(BadInputError, match="no samples: b, c"):
        convert(src, tmp_path / "s", to="lmdb", workers=0, strict=True)
    assert not (tmp_path / "s").exists()


def test_hidden_entries_are_listed_not_searched(tmp_path, photos):
    src = tmp_path / "src"
    (src / ".git" / "objects").mkdir(parents=True)
    (src / ".git" / "objects" / "a.jpg").write_bytes(photos[0].path.read_bytes())
    (src / ".DS_Store").write_bytes(b"\0")
    shutil.copy(photos[1].path, src / "img.jpg")
    s = scan(src)
    assert s.kind == "folder" and [i.rel for i in s.items] == ["img.jpg"]
    assert {e["path"] for e in s.not_taken} == {".DS_Store", ".git"}
    assert all("hidden" in e["reason"] for e in s.not_taken)
