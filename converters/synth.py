"""Real-looking test photos: random crops of the sample photographs scikit-image ships (no network)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from feedpipe.errors import MissingDependencyError

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
          "retina")


def _load_photos(names: tuple[str, ...]) -> list[np.ndarray]:
    try:
        import skimage.data
    except ImportError as exc:
        raise MissingDependencyError("sample photos need scikit-image: pip install 'feedpipe[demo]'"
                                     ) from exc
    return [np.asarray(getattr(skimage.data, n)())[:, :, :3] for n in names]


def make_photos(out: str | Path, n: int, *, size: tuple[int, int] = (500, 375), classes: int = 4,
                quality: int = 90, seed: int = 0) -> Path:
    """Write ``n`` JPEG photos (about ``size`` W×H) into an ImageFolder tree ``out/<class>/``.

    Each class draws crops from its own source photograph, so labels are learnable; crops vary in
    position, scale, aspect (±8%) and flip.
    """
    out = Path(out)
    rng = np.random.default_rng(seed)
    names = PHOTOS[: max(1, min(classes, len(PHOTOS)))]
    photos = _load_photos(names)
    for name in names:
        (out / name).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        c = i % len(names)
        src = photos[c]
        h, w = src.shape[:2]
        tw = int(size[0] * rng.uniform(0.92, 1.08))
        th = int(size[1] * rng.uniform(0.92, 1.08))
        scale = rng.uniform(0.45, 1.0) * min(w / tw, h / th)
        cw, ch = max(8, int(tw * scale)), max(8, int(th * scale))
        x, y = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
        img = Image.fromarray(src[y:y + ch, x:x + cw]).resize((tw, th), Image.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        img.save(out / names[c] / f"{i:06d}.jpg", "JPEG", quality=quality)
    return out


def blob_mask(h: int, w: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    """An H×W uint8 mask of 1–4 smooth random blobs with indices 1..classes-1 (0 = background)."""
    from scipy import ndimage

    mask = np.zeros((h, w), np.uint8)
    for _ in range(int(rng.integers(1, 5))):
        noise = ndimage.gaussian_filter(rng.standard_normal((h // 4 + 1, w // 4 + 1)), 3)
        blob = np.kron(noise, np.ones((4, 4)))[:h, :w] > np.quantile(noise, 0.85)
        mask[blob] = int(rng.integers(1, max(2, classes)))
    return mask


def make_segmentation(out: str | Path, n: int, *, size: tuple[int, int] = (500, 375),
                      classes: int = 4, quality: int = 90, seed: int = 0) -> tuple[Path, Path]:
    """Write ``n`` photo/mask pairs: ``out/images/<i>.jpg`` and ``out/masks/<i>.png``.

    Photos as in :func:`make_photos`; each mask holds smooth random blobs, and the photo is tinted
    inside them (one colour per class) so the objects are visible and learnable.
    """
    out = Path(out)
    photos_dir = make_photos(out / "_photos", n, size=size, classes=1, quality=quality, seed=seed)
    images, masks = out / "images", out / "masks"
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 1)
    tint = rng.integers(0, 256, (max(2, classes), 3)).astype(np.float32)
    for i, p in enumerate(sorted(photos_dir.rglob("*.jpg"))):
        with Image.open(p) as im:
            rgb = np.asarray(im.convert("RGB"), dtype=np.float32)
        mask = blob_mask(rgb.shape[0], rgb.shape[1], classes, rng)
        inside = mask > 0
        rgb[inside] = 0.5 * rgb[inside] + 0.5 * tint[mask[inside]]
        Image.fromarray(rgb.astype(np.uint8)).save(images / f"{i:06d}.jpg", "JPEG",
                                                   quality=quality)
        Image.fromarray(mask, "L").save(masks / f"{i:06d}.png")
    for p in sorted(photos_dir.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    photos_dir.rmdir()
    return images, masks
