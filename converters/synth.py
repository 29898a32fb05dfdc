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
