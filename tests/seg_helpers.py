"""Helpers for the segmentation tests (masks, targets, the loader's shared geometry).

Module-level on purpose: ``user_target_fn`` is named as ``seg_helpers:user_target_fn`` in
conversions whose workers are forkserver/spawn processes, which import it by module name.

The reference implementations here are written from the definitions in ``converters/targets.py``'s
docstring, by brute force, without scipy, so that they check the library independently.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

# a user target's worker processes touch a file named by their pid in this folder (when set)
PID_DIR_ENV = "FEEDPIPE_TEST_TARGET_PID_DIR"

# very distinct flat colours, one per class: the class of a pixel can be read back from its colour
PALETTE = np.array([[0, 0, 0], [255, 0, 0], [0, 220, 0], [30, 60, 255], [255, 255, 255]],
                   np.uint8)


def user_target_fn(mask: np.ndarray) -> np.ndarray:
    """A user target: 1.5 on labelled pixels, + 0.25 × (index mod 3); float32, deterministic."""
    where = os.environ.get(PID_DIR_ENV)
    if where:
        Path(where, str(os.getpid())).touch()
    return ((mask > 0) * 1.5 + 0.25 * (mask.astype(np.int64) % 3)).astype(np.float32)


def user_target_expected(mask: np.ndarray) -> np.ndarray:
    """What ``user_target_fn`` computes, restated without the side effect."""
    m = mask.astype(np.int64)
    return np.where(m > 0, 1.5, 0.0) + 0.25 * (m % 3)


# --- brute-force references --------------------------------------------------------------------

def _pairwise_sq(h: int, w: int) -> np.ndarray:
    """Squared distances between the centres of all pixel pairs of an H×W grid (N×N, int)."""
    yy, xx = np.mgrid[:h, :w]
    y, x = yy.ravel(), xx.ravel()
    return (y[:, None] - y[None, :]) ** 2 + (x[:, None] - x[None, :]) ** 2


def ref_signed(obj: np.ndarray, cap: float) -> np.ndarray:
    """For each pixel: distance from its centre to the nearest centre on the other side − 0.5,
    negative inside ``obj``; ``±cap`` when there is no other side. float64."""
    obj = np.asarray(obj, bool)
    h, w = obj.shape
    if obj.all():
        return np.full((h, w), -cap)
    if not obj.any():
        return np.full((h, w), cap)
    d2 = _pairwise_sq(h, w)
    o = obj.ravel()
    other = o[:, None] != o[None, :]
    near = np.sqrt(np.where(other, d2, np.iinfo(np.int64).max).min(axis=1).astype(np.float64))
    val = near - 0.5
    return np.where(o, -val, val).reshape(h, w)


def ref_distance_map(mask: np.ndarray, *, signed: bool = False, per_class: bool = False,
                     num_classes: int | None = None, truncate: float | None = None,
                     normalize: bool = False) -> np.ndarray:
    """The distance map as the module docstring defines it (float64)."""
    mask = np.asarray(mask)
    cap = float(truncate) if truncate is not None else math.hypot(*mask.shape)
    if per_class:
        d = np.stack([ref_signed(mask == k, cap) for k in range(1, num_classes)], axis=-1)
    else:
        d = ref_signed(mask > 0, cap)
    if not signed:
        d = np.abs(d)
    if truncate is not None:
        d = np.clip(d, -cap, cap)
    if normalize:
        d = d / cap
    return d


def ref_boundary(mask: np.ndarray, width: float) -> np.ndarray:
    """1 on labelled pixels with a pixel of another label within ``width`` (Euclidean)."""
    mask = np.asarray(mask)
    h, w = mask.shape
    d2 = _pairwise_sq(h, w)
    m = mask.ravel()
    near_other = ((m[:, None] != m[None, :]) & (d2 <= width * width)).any(axis=1)
    return (near_other & (m != 0)).reshape(h, w).astype(np.uint8)


# --- synthetic segmentation sources ------------------------------------------------------------

def shape_mask(h: int, w: int, rng: np.random.Generator, classes: int = 4,
               shapes: int = 5) -> np.ndarray:
    """An H×W uint8 mask of a few random ellipses and rectangles with labels 1..classes-1."""
    mask = np.zeros((h, w), np.uint8)
    yy, xx = np.mgrid[:h, :w]
    for k in range(shapes):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(0.12, 0.3) * h, rng.uniform(0.12, 0.3) * w
        label = 1 + k % (classes - 1) if k < classes - 1 else int(rng.integers(1, classes))
        if rng.random() < 0.5:
            region = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
        else:
            region = (np.abs(yy - cy) <= ry) & (np.abs(xx - cx) <= rx)
        mask[region] = label
    return mask


def separated_ellipses(h: int, w: int, rng: np.random.Generator, classes: int = 4, n: int = 4,
                       min_r: float = 8.0, gap: float = 8.0) -> np.ndarray:
    """Non-overlapping ellipses (radii >= ``min_r``) at least ``gap`` px apart (bounding boxes) and
    from the image border, labels 1..classes-1: no structure (object, gap, sliver at the border)
    thinner than ~min(min_r, gap), so resampling cannot make one vanish."""
    mask = np.zeros((h, w), np.uint8)
    yy, xx = np.mgrid[:h, :w]
    boxes: list[tuple[float, float, float, float]] = []
    for _ in range(500):
        if len(boxes) == n:
            break
        ry = rng.uniform(min_r, max(min_r, 0.25 * h))
        rx = rng.uniform(min_r, max(min_r, 0.25 * w))
        if 2 * (ry + gap) >= h or 2 * (rx + gap) >= w:
            continue
        cy, cx = rng.uniform(ry + gap, h - ry - gap), rng.uniform(rx + gap, w - rx - gap)
        if any(abs(cy - by) < ry + bry + gap and abs(cx - bx) < rx + brx + gap
               for by, bx, bry, brx in boxes):
            continue
        boxes.append((cy, cx, ry, rx))
        mask[((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1] = 1 + len(boxes) % (classes - 1)
    return mask


def paint(mask: np.ndarray) -> np.ndarray:
    """The H×W×3 image whose every pixel has its class's palette colour."""
    return PALETTE[mask]


def nearest_class(image_hwc: np.ndarray) -> np.ndarray:
    """Per pixel, the palette class whose colour is closest to the pixel's colour."""
    d = ((image_hwc[..., None, :].astype(np.int32) - PALETTE.astype(np.int32)) ** 2).sum(-1)
    return d.argmin(-1)


def uniform_within(mask: np.ndarray, r: int) -> np.ndarray:
    """Pixels whose (2r+1)² neighbourhood (clipped at the border) holds a single label."""
    h, w = mask.shape
    pad = np.pad(mask.astype(np.int64), r, mode="edge")
    same = np.ones((h, w), bool)
    for dy in range(2 * r + 1):
        for dx in range(2 * r + 1):
            same &= pad[dy: dy + h, dx: dx + w] == mask
    return same


def write_shapes(root: Path, sizes: list[tuple[int, int]], *, seed: int, ext: str = ".jpg",
                 classes: int = 4, separated: bool = False) -> tuple[Path, Path]:
    """``root/images/<i>{ext}`` painted from ``root/masks/<i>.png`` (uint8, mode L) per W×H:
    overlapping random shapes, or (``separated``) well-separated ellipses."""
    rng = np.random.default_rng(seed)
    images, masks = root / "images", root / "masks"
    images.mkdir(parents=True)
    masks.mkdir(parents=True)
    for i, (w, h) in enumerate(sizes):
        if separated:
            r = max(5.0, min(h, w) / 12)
            mask = separated_ellipses(h, w, rng, classes, min_r=r, gap=r)
        else:
            mask = shape_mask(h, w, rng, classes)
        img = Image.fromarray(paint(mask))
        if ext == ".jpg":
            img.save(images / f"{i:03d}.jpg", "JPEG", quality=97, subsampling=0)
        else:
            img.save(images / f"{i:03d}{ext}")
        Image.fromarray(mask).save(masks / f"{i:03d}.png")
    return images, masks


def read_mask_file(path: Path) -> np.ndarray:
    """Reference mask read: the PNG's stored indices (palette indices for mode P), no conversion."""
    with Image.open(path) as im:
        return np.asarray(im)


def nearest_indices(n_out: int, start: Fraction, extent: Fraction, n_in: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Source pixel sampled by each output pixel centre of a nearest-neighbour resize of the span
    [start, start + extent) to ``n_out`` pixels, computed exactly: ``(a, b)`` with ``b = a - 1``
    where the centre falls exactly on a pixel edge (a tie either neighbour may take), else a."""
    a, b = [], []
    for i in range(n_out):
        x = start + (2 * i + 1) * extent / (2 * n_out)
        f = min(math.floor(x), n_in - 1)
        a.append(f)
        b.append(max(f - 1, 0) if x == math.floor(x) else f)
    return np.array(a), np.array(b)


def nearest_matches(out: np.ndarray, src: np.ndarray, box: tuple[Fraction, ...]) -> np.ndarray:
    """Per output pixel: does ``out`` hold a value that nearest-neighbour resampling of the box
    (left, top, width, height) of ``src`` may produce there (either side of an exact tie)?"""
    h, w = out.shape[:2]
    left, top, bw, bh = box
    ra, rb = nearest_indices(h, top, bh, src.shape[0])
    ca, cb = nearest_indices(w, left, bw, src.shape[1])
    ok = np.zeros(out.shape, bool)
    for r in (ra, rb):
        for c in (ca, cb):
            ok |= out == src[r[:, None], c[None, :]]
    return ok
