"""RGB colour segmentation masks: mapped to class indices through a palette file, an earlier
dataset's palette or `auto` (sorted colours on at least AUTO_MIN_PIXELS pixels of some mask,
printed and recorded in the manifest: a stray pixel renumbers nothing); unknown colours are
reported by file; without a palette the conversion fails and says what to pass (it used to write
nothing quietly)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fp_helpers import CLI
from PIL import Image

import feedpipe
from converters import convert
from feedpipe.errors import BadInputError

COLOURS = np.array([[0, 0, 0], [200, 10, 10], [10, 200, 10], [10, 10, 200]], np.uint8)


@pytest.fixture
def seg(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    rng = np.random.default_rng(0)
    classes = {}
    for i in range(4):
        idx = rng.integers(0, 3 if i < 3 else 4, (12, 16))  # only the last uses colour 3
        Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).save(
            images / f"im{i}.png")
        Image.fromarray(COLOURS[idx]).save(masks / f"im{i}.png")
        classes[f"im{i}.png"] = idx
    return images, masks, classes


def _masks(out: Path) -> dict[str, np.ndarray]:
    ds = feedpipe.open_dataset(out)
    return {ds[i]["path"]: ds[i]["mask"] for i in range(len(ds))}


def test_auto_palette_maps_every_pixel(seg, tmp_path: Path) -> None:
    images, masks, classes = seg
    res = convert(images, tmp_path / "o", to="lmdb", masks=masks, mask_palette="auto")
    assert res.written == 4
    got = _masks(tmp_path / "o")
    order = sorted(range(4), key=lambda k: tuple(COLOURS[k]))  # auto: colours sorted
    remap = np.argsort(order)
    for name, idx in classes.items():
        np.testing.assert_array_equal(got[name], remap[idx])
    pal = feedpipe.open_dataset(tmp_path / "o").manifest.conversion["mask_palette"]
    assert [tuple(p[:3]) for p in pal] == sorted(tuple(int(v) for v in c) for c in COLOURS)


def test_palette_file_and_unknown_colours_named(seg, tmp_path: Path) -> None:
    images, masks, classes = seg
    pal = tmp_path / "palette.json"
    pal.write_text(json.dumps({"#000000": 0, "200,10,10": 5, "#0ac80a": 7}))
    r = subprocess.run([*CLI, "convert", str(images), "--to", "hdf5", "-o", str(tmp_path / "o"),
                        "--masks", str(masks), "--mask-palette", str(pal), "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "skipped im3.png: mask im3.png: 1 colour(s) not in the palette (#0a0ac8)" in r.stdout
    got = _masks(tmp_path / "o")
    assert sorted(got) == ["im0.png", "im1.png", "im2.png"]
    np.testing.assert_array_equal(got["im1.png"], np.array([0, 5, 7])[classes["im1.png"]])


def test_rgb_masks_without_palette_say_what_to_pass(seg, tmp_path: Path) -> None:
    images, masks, _ = seg
    with pytest.raises(BadInputError, match="colour mask.*mask_palette"):
        convert(images, tmp_path / "o", to="lmdb", masks=masks)
    r = subprocess.run([*CLI, "convert", str(images), "--to", "lmdb", "-o", str(tmp_path / "p"),
                        "--masks", str(masks), "-q"], capture_output=True, text=True)
    assert r.returncode == 2 and "--mask-palette" in r.stderr


def test_a_stray_pixel_renumbers_nothing_and_is_named(seg, tmp_path: Path) -> None:
    # one pixel of a new colour that sorts between black and the others used to become class 1
    # and shift every other class of every mask; the palette was never shown
    images, masks, classes = seg
    before = convert(images, tmp_path / "a", to="lmdb", masks=masks, mask_palette="auto")
    stray = np.asarray(Image.open(masks / "im1.png")).copy()
    stray[0, 0] = (5, 5, 5)
    Image.fromarray(stray).save(masks / "im1.png")
    r = subprocess.run([*CLI, "convert", str(images), "--to", "lmdb", "-o", str(tmp_path / "b"),
                        "--masks", str(masks), "--mask-palette", "auto", "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    a, b = _masks(tmp_path / "a"), _masks(tmp_path / "b")
    assert sorted(b) == ["im0.png", "im2.png", "im3.png"]  # im1 skipped, by name
    for name in b:
        np.testing.assert_array_equal(a[name], b[name])
    m = feedpipe.open_dataset(tmp_path / "b").manifest
    assert m.conversion["mask_palette"] == [list(p) for p in before.mask_palette]
    assert m.conversion["mask_palette_left_out"] == [
        {"colour": "#050505", "pixels": 1, "mask": str(masks / "im1.png")}]
    shown = {f"#{r:02x}{g:02x}{b:02x}": k for r, g, b, k in before.mask_palette}
    line = next(ln for ln in r.stdout.splitlines() if "mask palette (4 colours" in ln)
    assert line.endswith(json.dumps(shown)), line  # the JSON a --mask-palette file takes
    assert "colour #050505 left out of the auto palette: at most 1 pixel(s)" in r.stdout
    assert "skipped im1.png: mask im1.png: 1 colour(s) not in the palette (#050505) on 1 " \
        "pixels" in r.stdout


def test_an_earlier_datasets_palette_keeps_its_numbering(seg, tmp_path: Path) -> None:
    images, masks, classes = seg
    first = convert(images, tmp_path / "a", to="lmdb", masks=masks, mask_palette="auto")
    big = np.asarray(Image.open(masks / "im2.png")).copy()
    big[:6] = (1, 1, 1)  # a new colour on 96 pixels: under auto it would be class 1
    Image.fromarray(big).save(masks / "im2.png")
    again = convert(images, tmp_path / "b", to="lmdb", masks=masks, mask_palette=tmp_path / "a")
    assert again.mask_palette == first.mask_palette
    assert [s["path"] for s in again.skipped] == ["im2.png"]
    np.testing.assert_array_equal(_masks(tmp_path / "b")["im3.png"],
                                  _masks(tmp_path / "a")["im3.png"])
