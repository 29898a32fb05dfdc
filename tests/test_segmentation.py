"""Segmentation: masks paired with images at conversion, targets computed from them, and the loader
applying one geometry (crop box + flip) to image, mask (nearest) and targets (bilinear, rescaled).

Sources are generated so that the truth is known independently: images are painted with one flat,
very distinct colour per mask class (``seg_helpers.PALETTE``), so the class of an image pixel can
be read back from its colour and compared with the mask pixel the loader put beside it.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import seg_helpers
import torch
from conftest import FORMATS
from fp_helpers import CLI, cli_main
from PIL import Image
from seg_helpers import (
    PID_DIR_ENV,
    nearest_class,
    nearest_matches,
    paint,
    read_mask_file,
    uniform_within,
    user_target_expected,
    write_shapes,
)

import feedpipe
from converters import convert, make_boundary, make_distance_map
from converters.synth import make_segmentation
from converters.targets import boundary, distance_map
from feedpipe import Output
from feedpipe.dataset.manifest import MANIFEST_NAME, Manifest
from feedpipe.errors import BadInputError, ConfigError
from feedpipe.schema.masks import MaskField, TargetField

TESTS = Path(__file__).resolve().parent
F16 = 2.0**-11
DM_T = 12.0  # truncation of the signed uint8 distance map "dm_s"
# non-square JPEG photos, big enough that random crops take the DCT-downscale decode path
JPG_SIZES = [(200, 150), (176, 208), (240, 170), (150, 150), (160, 120), (224, 224), (130, 190),
             (260, 200), (180, 180), (210, 160), (140, 230), (256, 192)]
# square PNGs (isotropic resize); a nearest resize to 48 px from these never samples a pixel edge
# except where the position is exactly representable (96: factor 2)
PNG_SIZES = [96, 144, 60, 168, 44, 100, 120, 72]
U8 = dict(device="cpu", output=Output(dtype="uint8"))


def seg_targets() -> list:
    return [make_distance_map(),
            make_distance_map(name="dm_s", signed=True, truncate=DM_T, dtype="uint8"),
            make_distance_map(name="dm_pc", signed=True, per_class=True, num_classes=4),
            make_boundary()]


ALL = ["image", "mask", "distance_map", "dm_s", "dm_pc", "boundary"]


def src_mask(masks: Path, rel: str) -> np.ndarray:
    return read_mask_file(masks / (Path(rel).stem + ".png"))


def assert_f16_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape
    assert (np.abs(got - want) <= np.abs(want) * F16 + 1e-6).all()


# --- fixtures (generated once per module, read-only) ------------------------------------------

@pytest.fixture(scope="module")
def shapes_jpg(tmp_path_factory) -> tuple[Path, Path]:
    """Painted shapes as high-quality JPEGs (4:4:4) + their masks: (images, masks)."""
    return write_shapes(tmp_path_factory.mktemp("shapes_jpg"), JPG_SIZES, seed=1)


@pytest.fixture(scope="module")
def jpg_packed(tmp_path_factory, shapes_jpg) -> dict[str, Path]:
    """``shapes_jpg`` packed (images passthrough) with every target, in each format."""
    images, masks = shapes_jpg
    root = tmp_path_factory.mktemp("jpg_packed")
    out = {}
    for fmt, store in zip(FORMATS, ("png", "raw", "png"), strict=True):
        opts = {"shard_count": 5} if fmt == "wds" else None
        res = convert(images, root / fmt, to=fmt, workers=0, masks=masks, mask_store=store,
                      targets=seg_targets(), writer_options=opts)
        assert res.written == len(JPG_SIZES) and not res.skipped and not res.unmatched_masks
        assert res.passthrough == len(JPG_SIZES)
        out[fmt] = root / fmt
    return out


@pytest.fixture(scope="module")
def png_packed(tmp_path_factory) -> tuple[Path, Path]:
    """Square painted PNGs of well-separated ellipses, stored lossless (PNG) with every target:
    (dataset, masks folder)."""
    root = tmp_path_factory.mktemp("shapes_png")
    images, masks = write_shapes(root, [(s, s) for s in PNG_SIZES], seed=2, ext=".png",
                                 separated=True)
    res = convert(images, root / "hdf5", to="hdf5", workers=0, masks=masks, store="reencode",
                  codec="png", targets=seg_targets())
    assert res.written == len(PNG_SIZES) and res.reencoded == len(PNG_SIZES)
    return root / "hdf5", masks


# --- conversion ------------------------------------------------------------------------------

def test_masks_and_targets_stored(jpg_packed, shapes_jpg, fmt):
    images, masks = shapes_jpg
    ds = feedpipe.open_dataset(jpg_packed[fmt])
    assert len(ds) == len(JPG_SIZES)
    mf = ds.schema["mask"]
    assert isinstance(mf, MaskField) and mf.num_classes == 4  # the largest index + 1
    assert mf.codec == {"lmdb": "png", "hdf5": "raw", "wds": "png"}[fmt]
    for name in ("distance_map", "dm_s", "dm_pc", "boundary"):
        assert isinstance(ds.schema[name], TargetField)
    conv = ds.manifest.conversion
    assert set(conv["targets"]) == {"distance_map", "dm_s", "dm_pc", "boundary"}
    assert conv["targets"]["dm_s"]["truncate"] == DM_T and conv["masks_without_images"] == []
    seen = []
    for i in range(len(ds)):
        s = ds[i]
        seen.append(s["path"])
        m = src_mask(masks, s["path"])
        assert s["mask"].dtype == np.uint8
        np.testing.assert_array_equal(s["mask"], m)
        assert ds.read_raw(i)["image"] == (images / s["path"]).read_bytes()  # passthrough
        assert s["image"].shape[:2] == m.shape
        assert_f16_close(s["distance_map"], distance_map(m))
        assert_f16_close(s["dm_pc"], distance_map(m, signed=True, per_class=True, num_classes=4))
        want = distance_map(m, signed=True, truncate=DM_T)
        assert s["dm_s"].dtype == np.float32
        assert np.abs(s["dm_s"] - want).max() <= 2 * DM_T / 255 / 2 + 1e-5
        assert s["boundary"].dtype == np.uint8
        np.testing.assert_array_equal(s["boundary"], boundary(m))
    assert seen == sorted(p.name for p in images.iterdir())


@pytest.mark.parametrize("mask_store,mask_dtype", [
    ("raw", "uint8"), ("png", "uint8"), ("raw", "uint16"), ("png", "uint16"),
])
def test_mask_storage_is_lossless(tmp_path, fmt, mask_store, mask_dtype):
    """Index masks (L, P with a palette, 1-bit, 16-bit) come back exactly, in the stored dtype,
    from the reader and (resized nearest) from the loader; indices > 255 survive in uint16."""
    images, masks = tmp_path / "im", tmp_path / "mk"
    images.mkdir()
    masks.mkdir()
    rng = np.random.default_rng(7)
    top = 255 if mask_dtype == "uint8" else 65535
    want = {}
    for i, (w, h) in enumerate([(40, 30), (33, 47), (48, 36), (30, 30), (64, 24)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(images / f"{i}.png")
        m = rng.integers(0, 6, (h, w))
        if i == 0:  # mode L, uint8 extremes
            m = np.where(m > 2, 255, m).astype(np.uint8)
            im = Image.fromarray(m)
        elif i == 1:  # palette image: the indices are the mask, not the colours
            m = m.astype(np.uint8)
            im = Image.frombytes("P", (w, h), m.tobytes())
            im.putpalette([200, 10, 10, 0, 0, 0, 7, 7, 7, 90, 1, 250, 3, 3, 3, 255, 255, 255])
        elif i == 2:  # 1-bit
            m = (m > 2).astype(np.uint8)
            im = Image.fromarray(m * 255).convert("1")
        elif mask_dtype == "uint16":  # 16-bit grey with indices beyond 255
            m = (m * 13107).astype(np.uint16)  # 0 .. 65535
            im = Image.fromarray(m)
        else:
            m = (m * 51).astype(np.uint8)
            im = Image.fromarray(m)
        im.save(masks / f"{i}.png")
        assert im.mode in ("L", "P", "1", "I;16")
        want[f"{i}.png"] = m
    res = convert(images, tmp_path / "o", to=fmt, workers=0, masks=masks, mask_store=mask_store,
                  mask_dtype=mask_dtype)
    assert res.written == 5 and not res.skipped
    ds = feedpipe.open_dataset(tmp_path / "o")
    mf = ds.schema["mask"]
    assert mf.codec == mask_store and np.dtype(mf.dtype) == np.dtype(mask_dtype)
    assert mf.num_classes == top + 1
    for i in range(len(ds)):
        s = ds[i]
        assert s["mask"].dtype == np.dtype(mask_dtype)
        np.testing.assert_array_equal(s["mask"], want[s["path"]])
    ld = feedpipe.make_loader(tmp_path / "o", 5, size=(12, 20), crop="resize", shuffle=False,
                              fields=["mask", "path"], num_workers=0, **U8)
    (b,) = list(ld)
    # documented batch dtypes: uint8 masks stay uint8, uint16 masks travel as int32
    assert b["mask"].dtype == {"uint8": torch.uint8, "uint16": torch.int32}[mask_dtype]
    assert b["mask"].shape == (5, 12, 20)
    assert int(b["mask"].max()) == top
    for k, p in enumerate(b["path"]):
        m = want[p]
        box = (Fraction(0), Fraction(0), Fraction(m.shape[1]), Fraction(m.shape[0]))
        assert nearest_matches(b["mask"][k].numpy(), m, box).all(), p


def test_pairing_by_relative_path_then_unique_stem(tmp_path, capsys):
    images, masks = tmp_path / "images", tmp_path / "masks"
    rng = np.random.default_rng(3)
    pairs = {"a/x.jpg": "a/x.png",  # same relative path, other extension
             "b/y.jpg": "y.png",  # a unique stem in another folder
             "z.jpg": None,  # no mask
             "c/w.jpg": None}  # two masks share the stem w: ambiguous, so none
    mask_files = ["a/x.png", "y.png", "extra.png", "d/w.png", "e/w.png"]
    for rel in pairs:
        (images / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(paint(np.zeros((20, 30), np.uint8))).save(images / rel, quality=95)
    made = {}
    for rel in mask_files:
        (masks / rel).parent.mkdir(parents=True, exist_ok=True)
        made[rel] = rng.integers(0, 3, (20, 30)).astype(np.uint8)
        Image.fromarray(made[rel]).save(masks / rel)
    # z.jpg beside sub-folders: read flat, or class folders would win and refuse it
    res = convert(images, tmp_path / "o", to="lmdb", workers=0, masks=masks, layout="flat")
    assert res.written == 2
    no_mask = "no mask file matches this image"
    assert sorted(res.skipped, key=lambda s: s["path"]) == [
        {"path": "c/w.jpg", "reason": no_mask}, {"path": "z.jpg", "reason": no_mask}]
    assert sorted(res.unmatched_masks) == ["d/w.png", "e/w.png", "extra.png"]
    ds = feedpipe.open_dataset(tmp_path / "o")
    got = {s["path"]: s["mask"] for s in (ds[i] for i in range(len(ds)))}
    assert set(got) == {"a/x.jpg", "b/y.jpg"}
    for rel, m in got.items():
        np.testing.assert_array_equal(m, made[pairs[rel]])
    man = Manifest.read(tmp_path / "o")
    assert sorted(man.skipped, key=lambda s: s["path"]) == sorted(res.skipped,
                                                                  key=lambda s: s["path"])
    assert sorted(man.conversion["masks_without_images"]) == ["d/w.png", "e/w.png", "extra.png"]
    assert man.conversion["masks"] == str(masks)
    rc, out, _ = cli_main(capsys, "info", tmp_path / "o")
    assert rc == 0 and "masks without an image: 3" in out and "skipped inputs: 2" in out
    assert "mask: raw, uint8, 3 classes" in out or "mask: png, uint8, 3 classes" in out


def test_one_mask_never_serves_two_images_by_stem(tmp_path):
    """a/1.jpg and b/1.jpg beside a flat masks/1.png: the stem is ambiguous on the image side, so
    neither image gets it (both skipped), and the mask is reported unmatched."""
    images, masks = tmp_path / "images", tmp_path / "masks"
    for rel in ("a/1.jpg", "b/1.jpg", "b/2.jpg"):
        (images / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(paint(np.zeros((20, 30), np.uint8))).save(images / rel, quality=95)
    masks.mkdir()
    for name in ("1.png", "2.png"):
        Image.fromarray(np.ones((20, 30), np.uint8)).save(masks / name)
    res = convert(images, tmp_path / "o", to="lmdb", workers=0, masks=masks)
    assert res.written == 1
    assert sorted(s["path"] for s in res.skipped) == ["a/1.jpg", "b/1.jpg"]
    assert res.unmatched_masks == ["1.png"]
    assert feedpipe.open_dataset(tmp_path / "o")[0]["path"] == "b/2.jpg"


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_manifest_mask_column(tmp_path, shapes_jpg, kind):
    images, masks = shapes_jpg
    root = tmp_path / "data"
    (root / "img").mkdir(parents=True)
    (root / "seg" / "deep").mkdir(parents=True)
    rows = []
    for k in range(5):
        src = sorted(images.iterdir())[k]
        (root / "img" / f"p{k}.jpg").write_bytes(src.read_bytes())
        mask = f"seg/deep/m{k}.png" if k != 3 else ""  # row 3 has no mask
        if mask:
            (root / mask).write_bytes((masks / (src.stem + ".png")).read_bytes())
        rows.append({"path": f"img/p{k}.jpg", "mask": mask, "label": k % 2, "note": f"n{k}"})
    if kind == "csv":
        with open(root / "list.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, ["path", "mask", "label", "note"])
            w.writeheader()
            w.writerows(rows)
    else:
        with open(root / "list.jsonl", "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps({k: v for k, v in r.items() if v != ""}) + "\n")
    res = convert(root / f"list.{kind}", tmp_path / "o", to="wds", workers=0,
                  targets=["distance_map"])
    assert res.written == 4
    assert res.skipped == [{"path": "img/p3.jpg", "reason": "no mask file matches this image"}]
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert "mask" in ds.schema and "distance_map" in ds.schema
    assert ds.manifest.conversion["masks"] == "manifest column 'mask'"
    for i in range(len(ds)):
        s = ds[i]
        k = int(s["path"][5])
        want = read_mask_file(root / rows[k]["mask"])
        np.testing.assert_array_equal(s["mask"], want)
        assert s["label"] == k % 2 and s["meta"] == {"note": f"n{k}"}  # no 'mask' in meta
        assert_f16_close(s["distance_map"], distance_map(want))


def test_bad_masks_are_skipped_with_a_reason(tmp_path):
    images, masks = tmp_path / "im", tmp_path / "mk"
    images.mkdir()
    masks.mkdir()
    good = np.zeros((20, 30), np.uint8)
    good[5:15, 5:20] = 2
    for name in ("good", "rgb", "size", "corrupt", "index", "wide", "la"):
        Image.fromarray(paint(good)).save(images / f"{name}.jpg", quality=95)
    Image.fromarray(good).save(masks / "good.png")
    Image.fromarray(paint(good)).save(masks / "rgb.png")  # a colour mask
    Image.fromarray(good[:, :29]).save(masks / "size.png")
    (masks / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)
    Image.fromarray(np.where(good > 0, 7, 0).astype(np.uint8)).save(masks / "index.png")
    Image.fromarray(np.where(good > 0, 300, 0).astype(np.uint16)).save(masks / "wide.png")
    Image.fromarray(good).convert("LA").save(masks / "la.png")
    res = convert(images, tmp_path / "o", to="hdf5", workers=0, masks=masks, num_classes=4)
    assert res.written == 1
    reasons = {s["path"]: s["reason"] for s in res.skipped}
    assert set(reasons) == {"rgb.jpg", "size.jpg", "corrupt.jpg", "index.jpg", "wide.jpg",
                            "la.jpg"}
    for name, reason in reasons.items():
        assert Path(name).stem + ".png" in reason, reason  # names the mask file
    assert "RGB" in reasons["rgb.jpg"]
    assert "29x20" in reasons["size.jpg"] and "30x20" in reasons["size.jpg"]
    assert "7" in reasons["index.jpg"] and "num_classes" in reasons["index.jpg"]
    assert "300" in reasons["wide.jpg"] and "uint16" in reasons["wide.jpg"]
    ds = feedpipe.open_dataset(tmp_path / "o")
    assert [s["path"] for s in ds] == ["good.jpg"] and ds.schema["mask"].num_classes == 4
    assert {s["path"] for s in ds.manifest.skipped} == set(reasons)
    with pytest.raises(BadInputError, match="corrupt.png"):
        convert(images, tmp_path / "strict", to="lmdb", workers=0, masks=masks, strict=True)


@pytest.mark.parametrize("store,resize", [("raw", 64), ("reencode", 40)])
def test_resize_keeps_image_mask_and_targets_aligned(tmp_path, shapes_jpg, fmt, store, resize):
    """``store="raw", resize=64``: image, mask (nearest, same box) and targets all 64×64, targets
    computed on the resized mask; reencode+resize: shorter side to 40, aspect kept."""
    images, masks = shapes_jpg
    kw = dict(codec="png") if store == "reencode" else {}
    res = convert(images, tmp_path / "o", to=fmt, workers=0, masks=masks, store=store,
                  resize=resize, targets=seg_targets(), **kw)
    assert res.written == len(JPG_SIZES) and not res.skipped
    ds = feedpipe.open_dataset(tmp_path / "o")
    if store == "raw":
        assert ds.schema["mask"].shape == (64, 64)
        assert ds.schema["dm_pc"].shape == (64, 64, 3)
    good = total = 0
    for i in range(len(ds)):
        s = ds[i]
        src = src_mask(masks, s["path"])
        h, w = src.shape
        m = s["mask"]
        if store == "raw":
            assert s["image"].shape == (64, 64, 3) and m.shape == (64, 64)
            side = Fraction(min(w, h))
            box = ((w - side) / 2, (h - side) / 2, side, side)
        else:
            scale = resize / min(w, h)
            assert m.shape == s["image"].shape[:2]
            assert min(m.shape) == resize
            assert m.shape == (max(resize, round(h * scale)), max(resize, round(w * scale)))
            box = (Fraction(0), Fraction(0), Fraction(w), Fraction(h))
        assert nearest_matches(m, src, box).all(), s["path"]
        inner = uniform_within(m, 2)
        total += inner.sum()
        good += (nearest_class(s["image"]) == m)[inner].sum()
        assert_f16_close(s["distance_map"], distance_map(m))
        assert_f16_close(s["dm_pc"], distance_map(m, signed=True, per_class=True, num_classes=4))
        assert np.abs(s["dm_s"] - distance_map(m, signed=True, truncate=DM_T)).max() \
            <= DM_T / 255 + 1e-5
        np.testing.assert_array_equal(s["boundary"], boundary(m))
    assert total > 10_000 and good / total >= 0.995


def test_resize_uint16_masks(tmp_path):
    """uint16 masks (indices > 255) are resized nearest with the image, values kept."""
    images, masks = tmp_path / "im", tmp_path / "mk"
    images.mkdir()
    masks.mkdir()
    m = np.zeros((30, 40), np.uint16)
    m[5:25, 10:30] = 1000
    Image.fromarray(paint((m > 0).astype(np.uint8))).save(images / "a.png")
    Image.fromarray(m).save(masks / "a.png")
    convert(images, tmp_path / "o", to="lmdb", workers=0, masks=masks, mask_store="raw",
            mask_dtype="uint16", store="raw", resize=16)
    got = feedpipe.open_dataset(tmp_path / "o")[0]["mask"]
    assert got.dtype == np.uint16 and got.shape == (16, 16) and set(np.unique(got)) == {0, 1000}
    side = Fraction(30)  # the centre 30×30 square of the 40×30 mask
    assert nearest_matches(got, m, ((40 - side) / 2, Fraction(0), side, side)).all()


def test_exif_rotated_image_pairs_with_its_upright_mask(tmp_path):
    """A JPEG stored sideways with an EXIF orientation is shown (and stored) upright; its mask is
    drawn on the upright picture and must line up with it."""
    rng = np.random.default_rng(5)
    mask = seg_helpers.shape_mask(60, 90, rng)
    (tmp_path / "im").mkdir()
    (tmp_path / "mk").mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    sideways = Image.fromarray(np.ascontiguousarray(np.rot90(paint(mask), 1)))
    sideways.save(tmp_path / "im" / "r.jpg", quality=97, subsampling=0, exif=exif.tobytes())
    Image.fromarray(mask).save(tmp_path / "mk" / "r.png")
    res = convert(tmp_path / "im", tmp_path / "o", to="lmdb", workers=0, masks=tmp_path / "mk",
                  targets=["boundary"])
    assert res.written == 1 and res.reencoded == 1
    s = feedpipe.open_dataset(tmp_path / "o")[0]
    assert s["image"].shape == (60, 90, 3)
    np.testing.assert_array_equal(s["mask"], mask)
    inner = uniform_within(mask, 1)
    assert (nearest_class(s["image"]) == mask)[inner].mean() >= 0.995


@pytest.mark.parametrize("kwargs", [
    {"targets": ["distance_map"]},  # targets without masks
    {"masks": "MASKS", "targets": ["no_such_target"]},
    {"masks": "MASKS", "targets": {"mask": seg_helpers.user_target_fn}},  # clashes with a field
    {"masks": "MASKS", "targets": [make_boundary(), make_boundary()]},  # duplicate names
    {"masks": "MASKS", "mask_store": "jpeg"},
    {"masks": "MASKS", "mask_dtype": "int32"},
    {"masks": "MASKS", "targets": {"t": "seg_helpers:nope"}},
])
def test_bad_segmentation_options_are_config_errors(tmp_path, shapes_jpg, kwargs):
    images, masks = shapes_jpg
    kwargs = {k: (masks if v == "MASKS" else v) for k, v in kwargs.items()}
    with pytest.raises(ConfigError):
        convert(images, tmp_path / "o", to="lmdb", workers=0, **kwargs)
    assert not (tmp_path / "o").exists()
    with pytest.raises(FileNotFoundError):
        convert(images, tmp_path / "o", to="lmdb", workers=0, masks=tmp_path / "missing")


@pytest.mark.parametrize("args,message", [
    (["--targets", "distance_map", "--distance-dtype", "uint8"], "truncate"),
    (["--targets", "distance_map,halo"], "halo"),
    (["--target", "nameonly"], "name=package.module:function"),
    (["--target", "t=no_such_module_xyz:f"], "cannot import"),
    (["--targets", "distance_map", "--distance-per-class"], "num_classes"),
])
def test_cli_bad_target_options(tmp_path, shapes_jpg, capsys, args, message):
    images, masks = shapes_jpg
    rc, _, err = cli_main(capsys, "convert", images, "--to", "lmdb", "-o", tmp_path / "o",
                          "--masks", masks, "-q", *args)
    assert rc == 2 and message in err
    assert not (tmp_path / "o").exists()


def test_cli_convert_and_info_with_a_user_target_in_worker_processes(tmp_path, capsys):
    """64 pairs (the pool starts at 64 items) converted by the CLI with --workers 2: the user
    target named module:function runs in the worker processes, not in the CLI process."""
    images, masks = make_segmentation(tmp_path / "seg", 64, size=(64, 48), classes=4, seed=3)
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, PID_DIR_ENV: str(pids),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "cli out"
    proc = subprocess.Popen(
        [*CLI, "convert", images, "--to", "hdf5", "-o", out, "--masks", masks,
         "--targets", "distance_map,boundary", "--distance-signed", "--distance-truncate", "20",
         "--distance-dtype", "uint8", "--boundary-width", "1",
         "--target", "mine=seg_helpers:user_target_fn", "--num-classes", "4",
         "--mask-store", "png", "--workers", "2", "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "wrote 64 samples" in stdout
    workers = {int(p.name) for p in pids.iterdir()}
    assert workers and proc.pid not in workers  # computed in pool processes only
    rc, info, _ = cli_main(capsys, "info", out)
    assert rc == 0
    lines = info.splitlines()
    assert "mask: png, uint8, 4 classes" in lines
    dm = next(line for line in lines if line.startswith("target distance_map: distance_map("))
    assert "signed=True" in dm and "truncate=20.0" in dm and "stored uint8" in dm
    assert f"{40 / 255:.6g}" in dm and "linear" in dm
    bd = next(line for line in lines if line.startswith("target boundary: boundary("))
    assert "width=1.0" in bd and "nearest" in bd
    mine = next(line for line in lines if line.startswith("target mine: "))
    assert "seg_helpers:user_target_fn" in mine and "float16" in mine
    ds = feedpipe.open_dataset(out)
    assert len(ds) == 64 and ds.schema["mask"].num_classes == 4
    for i in range(len(ds)):
        s = ds[i]
        m = read_mask_file(masks / (Path(s["path"]).stem + ".png"))
        np.testing.assert_array_equal(s["mask"], m)
        assert np.abs(s["distance_map"] - distance_map(m, signed=True, truncate=20)).max() \
            <= 40 / 255 / 2 + 1e-5
        np.testing.assert_array_equal(s["boundary"], boundary(m, width=1))
        assert_f16_close(s["mine"], user_target_expected(m).astype(np.float32))


def test_python_api_user_targets_run_in_workers(tmp_path):
    """{name: function} and {name: "module:function"} targets pickle into the conversion pool and
    give the same dataset as an in-process conversion."""
    images, masks = make_segmentation(tmp_path / "seg", 64, size=(48, 40), classes=3, seed=4)
    targets = {"mine": seg_helpers.user_target_fn, "again": "seg_helpers:user_target_fn",
               "distance_map": "distance_map"}
    two = convert(images, tmp_path / "w2", to="lmdb", workers=2, masks=masks, targets=targets)
    one = convert(images, tmp_path / "w0", to="lmdb", workers=0, masks=masks, targets=targets)
    assert two.written == one.written == 64
    a, b = feedpipe.open_dataset(tmp_path / "w2"), feedpipe.open_dataset(tmp_path / "w0")
    assert a.schema == b.schema
    for i in range(64):
        ra, rb = a[i], b[i]
        assert ra["path"] == rb["path"]
        for k in ("mask", "mine", "again", "distance_map"):
            np.testing.assert_array_equal(ra[k], rb[k])
        np.testing.assert_array_equal(ra["mine"], ra["again"])
        assert_f16_close(ra["mine"], user_target_expected(ra["mask"]).astype(np.float32))


# --- loader ----------------------------------------------------------------------------------

def check_alignment(batches: list[dict], r: int = 2) -> tuple[int, float, float]:
    """Pixels farther than ``r`` output px from any mask edge: (count, share whose image colour
    is the mask's class, share that agrees with the mirrored mask instead)."""
    total = good = mirrored = 0
    for b in batches:
        img = b["image"].permute(0, 2, 3, 1).numpy()
        for k, m in enumerate(b["mask"].numpy()):
            inner = uniform_within(m, r)
            cls = nearest_class(img[k])
            total += inner.sum()
            good += (cls == m)[inner].sum()
            mirrored += (cls == m[:, ::-1])[inner].sum()
    return total, good / total, mirrored / total


@pytest.mark.parametrize("fmt,workers", [("lmdb", 0), ("hdf5", 0), ("wds", 0), ("lmdb", 2),
                                         ("wds", 2)])
def test_random_crops_keep_image_mask_and_targets_aligned(jpg_packed, fmt, workers):
    ld = feedpipe.make_loader(jpg_packed[fmt], 5, size=24, crop="random_resized_crop",
                              flip=True, fields=ALL, num_workers=workers, seed=11, **U8)
    batches = list(ld) + list(ld)  # two epochs: 24 different crops
    b0 = batches[0]
    assert b0["image"].shape == (5, 3, 24, 24) and b0["image"].dtype == torch.uint8
    assert b0["mask"].shape == (5, 24, 24) and b0["mask"].dtype == torch.uint8
    assert b0["distance_map"].shape == (5, 24, 24) and b0["distance_map"].dtype == torch.float32
    assert b0["dm_s"].dtype == torch.float32
    assert b0["dm_pc"].shape == (5, 24, 24, 3) and b0["dm_pc"].dtype == torch.float32
    assert b0["boundary"].shape == (5, 24, 24) and b0["boundary"].dtype == torch.uint8
    total, share, mirrored = check_alignment(batches)
    assert total > 5_000 and share >= 0.995
    assert mirrored < 0.9  # the check would notice a mask that missed the image's flip
    inner = bnd_total = bnd_edge = bnd_mirrored = 0
    sign_ok = pc_ok = 0
    for b in batches:
        for k, m in enumerate(b["mask"].numpy()):
            uni = uniform_within(m, 2)
            bd = b["boundary"][k].numpy().astype(bool)
            # boundary and mask are sampled at the same source pixels
            assert (m[bd] != 0).all()
            bnd_total += bd.sum()
            bnd_edge += (~uni[bd]).sum()
            bnd_mirrored += (~uni[:, ::-1][bd]).sum()
            # signed distances are negative exactly inside objects (away from edges)
            ds_, pc = b["dm_s"][k].numpy(), b["dm_pc"][k].numpy()
            inner += uni.sum()
            sign_ok += ((ds_ < 0) == (m > 0))[uni].sum()
            for c in (1, 2, 3):
                pc_ok += ((pc[..., c - 1] < 0) == (m == c))[uni].sum()
            assert (np.abs(ds_) <= DM_T + 1e-4).all()
            assert (b["distance_map"][k].numpy() >= 0).all()
    # boundary pixels lie at mask edges (a few where nearest sampling skipped a thin sliver)
    assert bnd_total > 100 and bnd_edge / bnd_total >= 0.95, (bnd_edge, bnd_total)
    assert bnd_mirrored / bnd_total < 0.8, (bnd_mirrored, bnd_total)  # vs a mirrored mask
    assert sign_ok / inner >= 0.995 and pc_ok / (3 * inner) >= 0.995


def test_same_batches_with_0_and_2_workers(jpg_packed):
    kw = dict(size=24, crop="random_resized_crop", flip=True, fields=ALL, seed=3, **U8)
    ref = list(feedpipe.make_loader(jpg_packed["wds"], 4, num_workers=0, **kw))
    got = list(feedpipe.make_loader(jpg_packed["wds"], 4, num_workers=2, **kw))
    assert len(ref) == len(got) == 3
    for a, b in zip(ref, got, strict=True):
        assert a.keys() == b.keys()
        for k in ALL:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("crop", ["resize", "center_crop"])
def test_isotropic_resize_distance_maps_match_recomputed(png_packed, crop):
    """Square sources resized to 48×48 (sx == sy): the mask is the exact nearest resample, and
    the loaded distance maps match distance_map() recomputed on the loaded mask within 1 output
    px + 5% (away from the truncation cap); absent classes' channels hold the output diagonal."""
    path, masks = png_packed
    s_out = 48
    ld = feedpipe.make_loader(path, 4, size=s_out, crop=crop, flip=True, shuffle=False, seed=2,
                              fields=[*ALL, "path"], num_workers=0, **U8)
    flips = []
    for b in ld:
        for k, rel in enumerate(b["path"]):
            src = src_mask(masks, rel)
            h = src.shape[0]
            scale = s_out / h
            m = b["mask"][k].numpy()
            box = (Fraction(0), Fraction(0), Fraction(h), Fraction(h))
            flip = not nearest_matches(m, src, box).all()
            flips.append(flip)
            assert nearest_matches(m[:, ::-1] if flip else m, src, box).all(), rel
            img = b["image"][k].permute(1, 2, 0).numpy()
            inner = uniform_within(m, 2)
            assert (nearest_class(img) == m)[inner].mean() >= 0.995
            for name, kw, cap in [
                ("distance_map", {}, None),
                ("dm_s", dict(signed=True, truncate=DM_T), DM_T * min(1.0, scale)),
                ("dm_pc", dict(signed=True, per_class=True, num_classes=4), None),
            ]:
                got = b[name][k].numpy()
                ref = distance_map(m, **kw)
                valid = np.ones(got.shape, bool)
                if cap is not None:  # values the source truncation (times the scale) has capped
                    valid = (np.abs(got) < cap - 1) & (np.abs(ref) < cap - 1)
                err = np.abs(got - ref)
                assert valid.sum() > 100
                assert (err <= 1.0 + 0.05 * np.abs(ref))[valid].all(), (rel, name,
                                                                         float(err[valid].max()))
            pc = b["dm_pc"][k].numpy()
            for c in (1, 2, 3):
                if not (src == c).any():  # no such object: the cap, rescaled → output diagonal
                    np.testing.assert_allclose(pc[..., c - 1], math.hypot(s_out, s_out),
                                               rtol=4 * F16)
            # the boundary is the stored boundary resampled nearest, flipped with the rest
            bsrc = boundary(src)
            bd = b["boundary"][k].numpy()
            assert nearest_matches(bd[:, ::-1] if flip else bd, bsrc, box).all()
    assert any(flips) and not all(flips)
    assert any(not (src_mask(masks, p) == c).any() for p in (f"{i:03d}.png"
                                                              for i in range(len(PNG_SIZES)))
               for c in (1, 2, 3))  # the absent-class case was exercised


def test_flip_moves_every_field_together(png_packed):
    path, _ = png_packed
    kw = dict(size=(40, 56), crop="resize", shuffle=False, seed=9, fields=ALL, num_workers=0,
              **U8)
    plain = list(feedpipe.make_loader(path, 4, flip=False, **kw))
    flipped = list(feedpipe.make_loader(path, 4, flip=True, **kw))
    seen = []
    for a, b in zip(plain, flipped, strict=True):
        for k in range(len(a["mask"])):
            was_flipped = not torch.equal(a["mask"][k], b["mask"][k])
            seen.append(was_flipped)
            for name in ALL:
                x, y = a[name][k], b[name][k]
                axis = 2 if name == "image" else 1  # image is C×H×W, the rest H×W(×C)
                want = x.flip(axis) if was_flipped else x
                assert torch.equal(y, want), (name, k, was_flipped)
    assert any(seen) and not all(seen)


def test_fields_without_image_follow_the_same_geometry(png_packed, jpg_packed):
    path, _ = png_packed
    kw = dict(size=32, crop="random_resized_crop", flip=True, seed=4, num_workers=0, **U8)
    full = list(feedpipe.make_loader(path, 4, fields=ALL, **kw))
    part = list(feedpipe.make_loader(path, 4, fields=["mask", "distance_map"], **kw))
    assert len(full) == len(part) == 2
    for a, b in zip(full, part, strict=True):
        assert set(b) == {"mask", "distance_map"}
        assert torch.equal(a["mask"], b["mask"])
        assert torch.equal(a["distance_map"], b["distance_map"])
    # JPEG sources (the image may snap the crop box to its DCT grid): still loads, and consistent
    (b,) = list(feedpipe.make_loader(jpg_packed["lmdb"], 12, fields=["mask", "dm_s"], **kw))
    m, d = b["mask"].numpy(), b["dm_s"].numpy()
    assert m.shape == (12, 32, 32) and d.shape == (12, 32, 32)
    inner = np.stack([uniform_within(x, 2) for x in m])
    assert ((d < 0) == (m > 0))[inner].mean() >= 0.995


def test_variable_size_masks_need_a_size(jpg_packed):
    with pytest.raises(ConfigError, match="size"):
        feedpipe.make_loader(jpg_packed["lmdb"], 4, fields=["mask"], num_workers=0, **U8)


# --- lossy masks and a void band ------------------------------------------------------------

def _void_band_pairs(root: Path, n: int = 3) -> tuple[Path, Path, list[np.ndarray]]:
    """VOC-style pairs: classes 0..3 as rectangles, each outlined by a 2-px band of 255 ("void",
    no class), 48×40 PNG masks beside JPEG images painted from the classes."""
    images, masks = root / "im", root / "mk"
    images.mkdir(parents=True)
    masks.mkdir()
    out = []
    for k in range(n):
        m = np.zeros((40, 48), np.uint8)
        for j, cls in enumerate((1, 2, 3)):
            top, left = 4 + 11 * j, 4 + 6 * k + 8 * j
            m[top - 2: top + 9, left - 2: left + 14] = 255  # the band around the object
            m[top: top + 7, left: left + 10] = cls
        Image.fromarray(paint(np.where(m == 255, 0, m))).save(images / f"s{k}.jpg", quality=95)
        Image.fromarray(m).save(masks / f"s{k}.png")
        out.append(m)
    return images, masks, out


def test_jpeg_masks_are_skipped_by_name(tmp_path):
    """A mask saved as JPEG: its artefacts would become classes (the largest index grows past
    the classes drawn); every lossy mask is skipped with a reason naming it, so num_classes
    counts only what the lossless masks hold."""
    images, masks, drawn = _void_band_pairs(tmp_path)
    (masks / "s1.png").unlink()
    clean = np.where(drawn[1] == 255, 0, drawn[1])
    Image.fromarray(clean).save(masks / "s1.jpg", quality=75)  # classes 0..3, JPEG-compressed
    assert int(np.asarray(Image.open(masks / "s1.jpg")).max()) > 3  # the artefacts are there
    Image.fromarray(clean).save(masks / "s2.png")
    (masks / "s0.png").unlink()
    (masks / "s0.webp").write_bytes(_lossy_webp(clean))
    res = convert(images, tmp_path / "o", to="lmdb", workers=0, masks=masks)
    reasons = {s["path"]: s["reason"] for s in res.skipped}
    assert set(reasons) == {"s0.jpg", "s1.jpg"} and res.written == 1
    assert "mask s1.jpg" in reasons["s1.jpg"] and "JPEG" in reasons["s1.jpg"]
    assert "mask s0.webp" in reasons["s0.jpg"] and "lossy WebP" in reasons["s0.jpg"]
    assert all("lossless" in r for r in reasons.values())
    assert feedpipe.open_dataset(tmp_path / "o").schema["mask"].num_classes == 4
    # colour masks too: a JPEG colour mask is skipped by name, not counted into the palette
    rgb = tmp_path / "rgb"
    rgb.mkdir()
    for k, m in enumerate(drawn):
        Image.fromarray(paint(np.where(m == 255, 0, m))).save(
            rgb / f"s{k}.jpg" if k == 0 else rgb / f"s{k}.png", quality=75)
    res = convert(images, tmp_path / "c", to="lmdb", workers=0, masks=rgb, mask_palette="auto")
    assert [s["path"] for s in res.skipped] == ["s0.jpg"] and "JPEG" in res.skipped[0]["reason"]
    assert res.mask_palette is not None and len(res.mask_palette) == 4


def _lossy_webp(mask: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(mask).save(buf, "WEBP", quality=70)
    return buf.getvalue()


def test_ignore_index_keeps_void_out_of_classes_and_targets(tmp_path, capsys):
    """--ignore-index 255: num_classes counts 0..3 (not 256), --num-classes 4 accepts the masks,
    the targets see the void band as background (no object, no boundary inside it), the manifest
    records it and the loader carries it; the stored masks keep their 255s."""
    images, masks, drawn = _void_band_pairs(tmp_path)
    targets = [make_distance_map(), make_boundary()]
    rc, _, err = cli_main(capsys, "convert", images, "--to", "lmdb", "-o", tmp_path / "strict",
                          "--masks", masks, "--num-classes", "4", "--workers", "0", "-q")
    assert rc != 0 and "255 >= num_classes 4" in err and "--ignore-index 255" in err
    for out, kw in (("auto", {}), ("given", {"num_classes": 4})):
        res = convert(images, tmp_path / out, to="lmdb", workers=0, masks=masks, targets=targets,
                      ignore_index=255, **kw)
        assert res.written == 3 and not res.skipped
        field = feedpipe.open_dataset(tmp_path / out).schema["mask"]
        assert (field.num_classes, field.ignore_index) == (4, 255)
    recorded = json.loads((tmp_path / "auto" / MANIFEST_NAME).read_text())
    assert any(f.get("ignore_index") == 255 for f in recorded["schema"])
    ds = feedpipe.open_dataset(tmp_path / "auto")
    for s, m in zip(ds, drawn, strict=True):
        assert np.array_equal(s["mask"], m)  # stored as it came, void and all
        background = np.where(m == 255, 0, m)
        assert_f16_close(s["distance_map"], distance_map(background))
        assert np.array_equal(s["boundary"], boundary(background))
        assert not s["boundary"][m == 255].any()  # the band is never a boundary
        assert (s["distance_map"][m == 255] > 0).all()  # nor an object (outside: positive)
    rc, out, _ = cli_main(capsys, "info", tmp_path / "auto")
    assert rc == 0 and "4 classes, ignore index 255" in out
    ld = feedpipe.make_loader(tmp_path / "auto", 3, size=(40, 48), crop="resize", shuffle=False,
                              fields=["image", "mask"], num_workers=0, **U8)
    assert ld.ignore_index == 255
    (batch,) = list(ld)
    assert np.array_equal(batch["mask"].numpy(), np.stack(drawn))
    loss = torch.nn.functional.cross_entropy(  # what it is for: void pixels add nothing
        torch.zeros(3, 4, 40, 48), batch["mask"].long(), ignore_index=ld.ignore_index)
    assert torch.isfinite(loss)
    plain = feedpipe.make_loader(jpg_packed_free(tmp_path), 1, size=8, fields=["mask"],
                                 num_workers=0, **U8)
    assert plain.ignore_index is None
    with pytest.raises(ConfigError, match="ignore_index"):
        convert(images, tmp_path / "no-masks", to="lmdb", workers=0, ignore_index=255)
    with pytest.raises(ConfigError, match="ignore_index=256"):
        convert(images, tmp_path / "wide", to="lmdb", workers=0, masks=masks, ignore_index=256)
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")  # a table: the option is named, not dropped
    rc, _, err = cli_main(capsys, "convert", tmp_path / "t.csv", "--to", "lmdb", "-o",
                          tmp_path / "t", "--ignore-index", "255", "-q")
    assert rc == 2 and "--ignore-index" in err


def jpg_packed_free(tmp_path: Path) -> Path:
    """A small mask dataset converted without ignore_index."""
    images, masks, _ = _void_band_pairs(tmp_path / "plain", 1)
    convert(images, tmp_path / "plain" / "o", to="lmdb", workers=0, masks=masks)
    return tmp_path / "plain" / "o"
