"""Colour segmentation masks: RGB colours → class indices, through a palette (a JSON file, an
earlier dataset's, or ``"auto"``; docs/sources.md)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from feedpipe.dataset.manifest import MANIFEST_NAME
from feedpipe.errors import ConfigError, CorruptRecordError, NotRegularFileError
from feedpipe.schema.imaging import DEFAULT_MAX_PIXELS, check_pixels, sniff_codec, webp_lossless

from .sources import open_regular, read_regular

Palette = tuple[tuple[int, int, int, int], ...]  # (r, g, b, class index)
Rare = tuple[dict[str, Any], ...]  # colours auto left out: {"colour", "pixels", "mask"}
AUTO_MAX = 256
#: ``auto`` takes a colour on this many pixels of some mask: a stray pixel's colour, named and left
#: out, would renumber every class after it
AUTO_MIN_PIXELS = 16


def _colour(text: Any, where: str) -> tuple[int, int, int]:
    if isinstance(text, str) and text.startswith("#") and len(text) == 7:
        rgb = tuple(int(text[i:i + 2], 16) for i in (1, 3, 5))
    else:
        rgb = tuple(int(p) for p in (text.split(",") if isinstance(text, str) else text))
    if len(rgb) != 3 or not all(0 <= c <= 255 for c in rgb):
        raise ConfigError(f"{where}: colour {text!r} is not r,g,b (0..255) or #rrggbb")
    return rgb  # type: ignore[return-value]


def load_palette(path: str | Path) -> Palette:
    """A palette JSON file, or the palette an earlier dataset (folder or manifest) recorded."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    try:
        d = json.loads(read_regular(path).decode())
        if isinstance(d, dict) and "feedpipe_manifest" in d:
            rows = (d.get("conversion") or {}).get("mask_palette")
            if not rows:
                raise ValueError("this dataset was converted without a colour mask palette")
            pairs: Any = ((row[:3], row[3]) for row in rows)
        else:
            pairs = d.items() if isinstance(d, dict) else ((c, k) for k, c in enumerate(d))
        pal = tuple((*_colour(c, str(path)), int(k)) for c, k in pairs)
    except (OSError, ValueError, TypeError, IndexError, NotRegularFileError) as exc:
        raise ConfigError(f"mask_palette={path}: {exc}; use a JSON object "
                          '{"#rrggbb": class index}, a list of colours, or a dataset converted '
                          "with a palette", option="mask_palette") from exc
    colours = [p[:3] for p in pal]
    if len(set(colours)) != len(colours):
        raise ConfigError(f"mask_palette={path}: a colour is listed twice", option="mask_palette")
    return pal


def show_palette(palette: Palette) -> str:
    """The palette as the JSON :func:`load_palette` reads: ``{"#000000": 0, ...}``."""
    return json.dumps({f"#{r:02x}{g:02x}{b:02x}": k for r, g, b, k in palette})


def refuse_lossy(data: bytes) -> None:
    """A JPEG or lossy WebP mask is a ValueError: its artefacts along the edges would be classes."""
    kind = sniff_codec(data)
    if kind == "jpeg" or (kind == "webp" and not webp_lossless(data)):
        raise ValueError(f"a {'JPEG' if kind == 'jpeg' else 'lossy WebP'}: masks must be "
                         "lossless (compression artefacts along the edges would become classes); "
                         "save the masks as PNG from their source")


def _rgb(path: Path, max_pixels: int | None = DEFAULT_MAX_PIXELS,
         data: bytes | None = None) -> np.ndarray | None:
    """A colour mask's H×W×3 pixels (from ``data`` when read already), None for an index mask;
    over ``max_pixels``, undecoded, a CorruptRecordError."""
    with (io.BytesIO(data) if data is not None else os.fdopen(open_regular(path)[0], "rb")) as fh, \
            Image.open(fh) as im:
        if im.mode not in ("RGB", "RGBA"):
            return None
        check_pixels(im.size[0], im.size[1], max_pixels, f"mask {path.name}", CorruptRecordError)
        return np.asarray(im.convert("RGB"))


def _packed(rgb: np.ndarray) -> np.ndarray:
    return (rgb[..., 0].astype(np.uint32) << 16) | (rgb[..., 1].astype(np.uint32) << 8) | rgb[..., 2]


def auto_palette(masks: Sequence[Path], max_pixels: int | None = DEFAULT_MAX_PIXELS
                 ) -> tuple[Palette, Rare]:
    """The colours on at least AUTO_MIN_PIXELS pixels of some colour mask, sorted, numbered
    0..K-1; and the colours left out, each with its largest pixel count and mask."""
    most: dict[int, tuple[int, Path]] = {}  # colour → (largest pixel count in one mask, mask)
    for m in masks:
        try:
            data = read_regular(m)  # never a FIFO's open, which waits for a writer forever
            refuse_lossy(data)
            rgb = _rgb(m, max_pixels, data)
        except (OSError, ValueError, CorruptRecordError, NotRegularFileError,
                Image.DecompressionBombError):
            continue  # unreadable, lossy, oversized or special masks are skipped later, by name
        if rgb is None:
            continue
        colours, counts = np.unique(_packed(rgb), return_counts=True)
        for c, n in zip(colours.tolist(), counts.tolist(), strict=True):
            if n > most.get(c, (0, m))[0]:
                most[c] = (n, m)
        if len(most) > AUTO_MAX:
            raise ConfigError(f"mask_palette='auto': the masks hold more than {AUTO_MAX} "
                              f"colours (counted up to {m}); colour masks with that many "
                              "colours are photos or anti-aliased: give a palette file",
                              option="mask_palette")
    classes = sorted(c for c, (n, _) in most.items() if n >= AUTO_MIN_PIXELS)
    rare = tuple({"colour": f"#{c:06x}", "pixels": n, "mask": str(m)}
                 for c, (n, m) in sorted(most.items()) if n < AUTO_MIN_PIXELS)
    return tuple((c >> 16, (c >> 8) & 255, c & 255, k) for k, c in enumerate(classes)), rare


def resolve_palette(spec: Any, masks: Sequence[Path],
                    max_pixels: int | None = DEFAULT_MAX_PIXELS) -> tuple[Palette | None, Rare]:
    """``"auto"``, a JSON file or dataset path, or a built palette; and the colours auto left out."""
    if spec is None:
        return None, ()
    if isinstance(spec, (str, Path)):
        return auto_palette(masks, max_pixels) if str(spec) == "auto" else \
            (load_palette(spec), ())
    return tuple(tuple(int(v) for v in p) for p in spec), ()  # type: ignore[misc]


def colour_mask(path: Path, palette: Palette, max_pixels: int | None = DEFAULT_MAX_PIXELS
                ) -> np.ndarray | None:
    """A colour mask → H×W class indices (uint8, or uint16 past 255); None for an index mask. A
    colour missing from the palette is a ValueError naming the colours."""
    rgb = _rgb(path, max_pixels)
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
                         f"pixels (auto takes only colours on at least {AUTO_MIN_PIXELS} pixels "
                         "of some mask; a palette file maps any colour)")
    out = vals[pos]
    return out.astype(np.uint16 if out.size and out.max() > 255 else np.uint8)
