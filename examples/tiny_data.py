"""Tiny generated source data for the examples, made in a second or two: the files a user would
have (image folders, CSV manifests, index-PNG masks, an hourly table), never a packed dataset, so
that each example shows the conversion step too. Every function writes under ``root`` and is
seeded: the same call gives the same files.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

CAPTCHA_VOCAB = "0123456789abcdefghjkmnpqrstuvwxyz"  # no i, l, o: as captcha generators do


def shapes(root: Path, n: int = 96, size: int = 64, seed: int = 0) -> Path:
    """An ImageFolder tree ``root/<class>/*.jpg``: circles, squares and triangles of random size
    and place on a noisy background, each class leaning to its own colour (so that a small CNN
    learns them in a few epochs)."""
    rng = np.random.default_rng(seed)
    classes = ("circle", "square", "triangle")
    tints = np.array([(200, 70, 60), (60, 190, 80), (70, 90, 210)])
    for k in range(n):
        name = classes[k % 3]
        img = _background(rng, size, size)
        draw = ImageDraw.Draw(img)
        r = rng.uniform(0.18, 0.32) * size
        cx, cy = rng.uniform(r, size - r, 2)
        colour = tuple(int(c) for c in np.clip(tints[k % 3] + rng.normal(0, 30, 3), 0, 255))
        if name == "circle":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
        elif name == "square":
            draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
        else:
            draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
        (root / name).mkdir(parents=True, exist_ok=True)
        img.save(root / name / f"{k:05d}.jpg", quality=90)
    return root


# 49 landmarks of the left half of a face (x < 0), in face units; each is mirrored to the right,
# so point 2i is on the left and 2i+1 its mirror: the flip indices swap each pair.
_HALF = np.random.default_rng(98).uniform((-0.8, -0.8), (-0.05, 0.8), (49, 2))
FACE_FLIP = [j ^ 1 for j in range(98)]


def faces(root: Path, n: int = 64, size: int = 96, seed: int = 0) -> Path:
    """``root/images/*.jpg`` and ``root/faces.csv`` (``path,landmarks``): a face-like ellipse
    with 98 dark landmarks on it (49 mirror pairs, :data:`FACE_FLIP`), moved, scaled and turned
    per image, as a 98-point (WFLW-style) landmark set."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    template = np.stack([_HALF, _HALF * (-1, 1)], 1).reshape(98, 2)  # left, right, left, ...
    rows = []
    for k in range(n):
        scale = rng.uniform(0.22, 0.3) * size
        angle = rng.uniform(-0.3, 0.3)
        centre = rng.uniform(0.4, 0.6, 2) * size
        turn = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        points = template @ turn.T * scale + centre
        img = _background(rng, size, size)
        draw = ImageDraw.Draw(img)
        tone = tuple(int(c) for c in rng.integers(150, 230, 3))
        box = np.concatenate([centre - scale * 1.05, centre + scale * 1.05])
        draw.ellipse(tuple(box.tolist()), fill=tone)
        for x, y in points:
            draw.ellipse((x - 1, y - 1, x + 1, y + 1), fill=(30, 20, 20))
        path = f"images/{k:05d}.jpg"
        img.save(root / path, quality=92)
        rows.append({"path": path, "landmarks": json.dumps(np.round(points, 2).tolist())})
    _write_csv(root / "faces.csv", rows)
    return root / "faces.csv"


def air_quality(hours: int = 24 * 120, seed: int = 0) -> dict[str, np.ndarray]:
    """An hourly PM2.5-style series: ``pm25`` (µg/m³, daily and weekly cycles that follow the
    weather), ``weather`` (temperature, pressure, dew point) and ``hour`` (of the day), with a
    few missing readings (NaN) as real stations have."""
    rng = np.random.default_rng(seed)
    t = np.arange(hours)
    day, week = np.sin(2 * np.pi * t / 24), np.sin(2 * np.pi * t / (24 * 7))
    temp = 12 + 8 * day + rng.normal(0, 1.5, hours)
    pres = 1015 + 6 * week + rng.normal(0, 1, hours)
    dewp = temp - 6 + rng.normal(0, 1, hours)
    pm25 = np.empty(hours)
    level = 60.0
    for i in range(hours):  # persistence plus the weather's push: what a forecaster can learn
        level = 0.9 * level + 0.1 * (70 + 25 * day[i] - 2 * (pres[i] - 1015)) + rng.normal(0, 4)
        pm25[i] = max(level, 1.0)
    for start in rng.integers(0, hours - 6, 3):
        pm25[start:start + int(rng.integers(1, 6))] = np.nan  # sensor gaps
    return {"pm25": pm25.astype(np.float32),
            "weather": np.stack([temp, pres, dewp], 1).astype(np.float32),
            "hour": (t % 24).astype(np.float32)}


def blobs(root: Path, n: int = 48, size: int = 64, seed: int = 0) -> tuple[Path, Path]:
    """``root/images/*.jpg`` and ``root/masks/*.png`` (index PNGs: 0 background, 1 object) of
    one to three ellipses each, for segmentation."""
    rng = np.random.default_rng(seed)
    images, masks = root / "images", root / "masks"
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        img = _background(rng, size, size)
        mask = Image.new("L", (size, size), 0)
        for _ in range(int(rng.integers(1, 4))):
            r = rng.uniform(0.1, 0.25, 2) * size
            cx, cy = rng.uniform(0.2, 0.8, 2) * size
            box = (cx - r[0], cy - r[1], cx + r[0], cy + r[1])
            ImageDraw.Draw(img).ellipse(box, fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
            ImageDraw.Draw(mask).ellipse(box, fill=1)
        img.save(images / f"{k:05d}.jpg", quality=92)
        mask.save(masks / f"{k:05d}.png")
    return images, masks


def captchas(root: Path, n: int = 96, size: tuple[int, int] = (32, 96),
             seed: int = 0) -> Path:
    """``root/images/*.png`` and ``root/captcha.csv`` (``path,text``): 4-5 characters of
    :data:`CAPTCHA_VOCAB` drawn with jitter and noise lines."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    h, w = size
    font = ImageFont.load_default(size=h * 0.6)
    rows = []
    for k in range(n):
        text = "".join(rng.choice(list(CAPTCHA_VOCAB), int(rng.integers(4, 6))))
        img = Image.new("RGB", (w, h), tuple(int(c) for c in rng.integers(200, 256, 3)))
        draw = ImageDraw.Draw(img)
        x = rng.uniform(2, 8)
        for ch in text:
            draw.text((x, rng.uniform(1, h * 0.3)), ch, font=font,
                      fill=tuple(int(c) for c in rng.integers(0, 90, 3)))
            x += w / 6.5 + rng.uniform(-1, 2)
        for _ in range(2):
            draw.line(tuple(rng.uniform(0, 1, 4) * (w, h, w, h)), fill=(90, 90, 90))
        path = f"images/{k:05d}.png"
        img.save(root / path)
        rows.append({"path": path, "text": text})
    _write_csv(root / "captcha.csv", rows)
    return root / "captcha.csv"


def _background(rng: np.random.Generator, h: int, w: int) -> Image.Image:
    """A noisy mid-grey canvas (so the JPEGs are not flat)."""
    base = rng.integers(60, 140, 3)
    noise = rng.normal(0, 12, (h, w, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def _write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
