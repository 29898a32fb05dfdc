"""RGB colour segmentation masks: mapped to class indices through a palette file or `auto`
(sorted colours, recorded in the manifest); unknown colours are reported by file; without a
palette the conversion fails and says what to pass (it used to write nothing quietly)."""

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
from feedpipe.errors import NothingConvertedError

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
    with pytest.raises(NothingConvertedError, match="colour mask.*mask_palette"):
        convert(images, tmp_path / "o", to="lmdb", masks=masks)
    r = subprocess.run([*CLI, "convert", str(images), "--to", "lmdb", "-o", str(tmp_path / "p"),
                        "--masks", str(masks), "-q"], capture_output=True, text=True)
    assert r.returncode == 2 and "--mask-palette" in r.stderr
