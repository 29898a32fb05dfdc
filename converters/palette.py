"""Colour segmentation masks: RGB colours → class indices, through a palette.

A palette is given as a JSON file (``{"#rrggbb" | "r,g,b": index}``, or a list of colours whose
positions are the indices) or built with ``"auto"``: every distinct colour of every mask
(at most 256), sorted by their (r, g, b) value, numbered 0..K-1 (so black, the usual background,
is 0 when present). The palette used is recorded in the manifest (``conversion.mask_palette``).
A mask holding a colour the palette lacks is skipped, and its file and colours named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from feedpipe.errors import ConfigError

Palette = tuple[tuple[int, int, int, int], ...]  # (r, g, b, class index)
AUTO_MAX = 256


def _colour(text: Any, where: str) -> tuple[int, int, int]:
    if isinstance(text, str) and text.startswith("#") and len(text) == 7:
        rgb = tuple(int(text[i:i + 2], 16) for i in (1, 3, 5))
    elif isinstance(text, str):
        rgb = tuple(int(p) for p in text.split(","))
    else:
        rgb = tuple(int(p) for p in text)
    if len(rgb) != 3 or not all(0 <= c <= 255 for c in rgb):
        raise ConfigError(f"{where}: colour {text!r} is not r,g,b (0..255) or #rrggbb")
    return rgb  # type: ignore[return-value]


def load_palette(path: str | Path) -> Palette:
    """A palette JSON file (see the module docstring)."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
        pairs = d.items() if isinstance(d, dict) else ((c, k) for k, c in enumerate(d))
        pal = tuple((*_colour(c, str(path)), int(k)) for c, k in pairs)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"mask_palette={path}: {exc}; use a JSON object "
                          '{"#rrggbb": class index} or a list of colours') from exc
    colours = [p[:3] for p in pal]
    if len(set(colours)) != len(colours):
        raise ConfigError(f"mask_palette={path}: a colour is listed twice")
    return pal


def _rgb(path: Path) -> np.ndarray | None:
    """A colour mask's H×W×3 pixels; None for an index mask (L, P, 1, I;16)."""
    with Image.open(path) as im:
        if im.mode not in ("RGB", "RGBA"):
            return None
        return np.asarray(im.convert("RGB"))


def _packed(rgb: np.ndarray) -> np.ndarray:
    return (rgb[..., 0].astype(np.uint32) << 16) | (rgb[..., 1].astype(np.uint32) << 8) | rgb[..., 2]


def auto_palette(masks: Sequence[Path]) -> Palette:
    """Every colour of every colour mask, sorted, numbered 0..K-1 (K ≤ 256)."""
    seen: set[int] = set()
    for m in masks:
        try:
            rgb = _rgb(m)
        except OSError:
            continue  # unreadable masks are skipped later, by name
        if rgb is not None:
            seen.update(np.unique(_packed(rgb)).tolist())
            if len(seen) > AUTO_MAX:
                raise ConfigError(f"mask_palette='auto': the masks hold more than {AUTO_MAX} "
                                  f"colours (counted up to {m}); colour masks with that many "
                                  "colours are photos or anti-aliased: give a palette file")
    return tuple((c >> 16, (c >> 8) & 255, c & 255, k) for k, c in enumerate(sorted(seen)))


def resolve_palette(spec: Any, masks: Sequence[Path]) -> Palette | None:
    """``"auto"``, a JSON file path, or an already built palette."""
    if spec is None:
        return None
    if isinstance(spec, (str, Path)):
        return auto_palette(masks) if str(spec) == "auto" else load_palette(spec)
    return tuple(tuple(int(v) for v in p) for p in spec)  # type: ignore[misc]


def colour_mask(path: Path, palette: Palette) -> np.ndarray | None:
    """A colour mask → H×W class indices (uint16 when an index exceeds 255); None for an index
    mask. A colour missing from the palette is a ValueError naming the file and the colours."""
    rgb = _rgb(path)
    if rgb is None:
        return None
    keys = np.array([(r << 16) | (g << 8) | b for r, g, b, _ in palette], np.uint32)
    vals = np.array([k for *_, k in palette], np.int64)
    order = np.argsort(keys)
    keys, vals = keys[order], vals[order]
    packed = _packed(rgb)
    pos = np.clip(np.searchsorted(keys, packed), 0, max(len(keys) - 1, 0))
    bad = keys[pos] != packed if len(keys) else np.ones(packed.shape, bool)
    if bad.any():
        unknown = np.unique(packed[bad])
        shown = ", ".join(f"#{c:06x}" for c in unknown[:5].tolist())
        raise ValueError(f"{len(unknown)} colour(s) not in the palette "
                         f"({shown}{' ...' if len(unknown) > 5 else ''}) on {int(bad.sum())} "
                         "pixels")
    out = vals[pos]
    return out.astype(np.uint16 if out.size and out.max() > 255 else np.uint8)
