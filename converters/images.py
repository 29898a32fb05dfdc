"""What the converter stores for one input image: lossless in, lossless out (the rules:
docs/convert.md). The only lossy step taken unasked, a JPEG or lossy WebP whose pixels must change
(EXIF rotation, CMYK, resize), is re-encoded in its own codec and named."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
from PIL import Image, ImageOps

from feedpipe.errors import BadInputError
from feedpipe.schema.codecs import JPEG_PROGRESSIVE
from feedpipe.schema.imaging import (
    encode_rgb,
    jpeg_fast_decodable,
    jpeg_problem,
    pil_to_rgb,
    read_jpeg_whole,
    sniff_codec,
    webp_lossless,
)

from .progressive import can_transcode, transcoded
from .result import Refused, Stored

if TYPE_CHECKING:
    from .options import PackOptions
    from .sources import SourceItem

JPEG_EXTS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif"})
_PNG_MODES = frozenset({"1", "L", "LA", "P", "RGB", "RGBA", "I;16"})
_DEEP = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N", "F"})


def output_codec(kind: str, lossless_webp: bool, opts: PackOptions) -> str:
    """The codec an input of format ``kind`` is stored as (the same for every such input)."""
    if opts.store == "raw":
        return "raw"
    if opts.codec != "auto":
        return opts.codec
    if kind == "jpeg" or (kind == "webp" and not lossless_webp):
        return kind
    return "png"


def planned_codec(data: bytes, opts: PackOptions) -> str:
    """The codec :func:`store_image` will store an encoded image as, from its first bytes."""
    kind = sniff_codec(data)
    return output_codec(kind, kind == "webp" and webp_lossless(data), opts)


def file_codec(path: Path, opts: PackOptions) -> str | None:
    """:func:`planned_codec` of a file's first bytes; None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # unbuffered: cheaper than open()
        try:
            head = os.read(fd, 64)
            if sniff_codec(head) == "webp":
                head += os.read(fd, 1 << 20)  # the image chunk may follow ICC/EXIF chunks
        finally:
            os.close(fd)
        if sniff_codec(head) == "unknown":  # a format without magic bytes here (TGA, ...)
            with Image.open(path):
                pass
    except (OSError, ValueError, SyntaxError):  # skipped later with the reason
        return None
    return planned_codec(head, opts)


def image_codec(items: Sequence[SourceItem], opts: PackOptions, sniff: bool = True) -> str:
    """The one codec every input is stored as, else "mixed"; ``sniff=False`` skips reading each
    file's first bytes and answers a provisional "mixed" (``pack.settle_codec`` narrows it)."""
    if opts.store == "raw":
        return "raw"
    if opts.codec != "auto":
        return opts.codec
    if not sniff:
        return "mixed"
    codecs = {file_codec(it.path, opts) for it in items} - {None}
    return codecs.pop() if len(codecs) == 1 else "mixed" if codecs else "jpeg"


def likely_jpeg(items: Sequence[SourceItem]) -> bool:
    """Whether every input is named like a JPEG (a cheap guess; never decides the codec)."""
    return all(it.path.suffix.lower() in JPEG_EXTS for it in items)


def geometry(w: int, h: int, opts: PackOptions) -> tuple[tuple[int, int], tuple[float, ...]] | None:
    """Output (W, H) and source box for ``opts.resize`` ((height, width) as a tuple), shared by
    an image and its mask."""
    if opts.resize is None:
        return None
    if isinstance(opts.resize, tuple):
        out_h, out_w = opts.resize
        return (out_w, out_h), (0, 0, w, h)
    s = opts.resize
    if opts.store == "raw":  # fixed size: shorter side to s, then the center s×s crop
        left, top = (w - min(w, h)) / 2, (h - min(w, h)) / 2
        return (s, s), (left, top, left + min(w, h), top + min(w, h))
    scale = s / min(w, h)
    return (max(s, round(w * scale)), max(s, round(h * scale))), (0, 0, w, h)


def resized_rgb(img: Image.Image, opts: PackOptions) -> np.ndarray:
    """8-bit RGB pixels, resized as ``opts.resize`` asks."""
    arr = pil_to_rgb(img)
    geo = geometry(arr.shape[1], arr.shape[0], opts)
    if geo is None:
        return arr
    return np.asarray(Image.fromarray(arr).resize(geo[0], Image.BILINEAR, box=geo[1]))


def _read_whole(data: bytes) -> None:
    """Refuse a JPEG whose data is damaged or that no decoder reads (``read_jpeg_whole``)."""
    try:
        read_jpeg_whole(data, "corrupt image")
    except BadInputError as exc:
        raise Refused(str(exc)) from exc


def _too_big(w: int, h: int, opts: PackOptions) -> None:
    if opts.max_pixels is not None and w * h > opts.max_pixels:
        raise Refused(f"declares {w}x{h} = {w * h:,} pixels, over the limit of "
                      f"{opts.max_pixels:,} (a decompression bomb?); raise it with "
                      "max_pixels= (--max-pixels)")


def _extra(img: Image.Image) -> str | None:
    """What 8-bit RGB storage would lose: transparency, unread channels, 16-bit colour."""
    if img.format == "TIFF":
        spp, bands = int(img.tag_v2.get(277, 1)), len(img.getbands())
        if spp > bands:
            return f"{spp} channels ({bands} fit an image field)"
        bits = img.tag_v2.get(258, (8,))
        bits = max(bits) if isinstance(bits, tuple) else int(bits)
        if bits > 8 and img.mode not in _DEEP:
            return f"{bits} bits per colour channel (read as 8)"
    if img.has_transparency_data:
        rgba = img if img.mode in ("RGBA", "LA", "PA") else img.convert("RGBA")
        if rgba.getchannel("A").getextrema()[0] < 255:
            return "an alpha channel with transparent pixels"
    return None


def _png(img: Image.Image, drop: bool) -> bytes:
    """Lossless PNG of ``img`` in its own mode (alpha removed when ``drop``)."""
    if drop and img.mode not in ("RGB", "L"):
        img = img.convert("L" if img.mode in ("LA", "La", "L") else "RGB")
    if img.mode in _DEEP - {"I;16"}:
        arr = np.asarray(img)
        if img.mode == "F" or arr.min(initial=0) < 0 or arr.max(initial=0) > 0xFFFF:
            raise Refused(f"mode {img.mode} samples do not fit 16-bit PNG losslessly")
        img = Image.fromarray(arr.astype(np.uint16))
    elif img.mode not in _PNG_MODES:  # CMYK, YCbCr, LAB, PA...: the colour conversion loading does
        img = img.convert("RGBA" if img.has_transparency_data else "RGB")
    out = io.BytesIO()
    img.save(out, "PNG", compress_level=6)
    return out.getvalue()


def store_image(data: bytes, opts: PackOptions, transcode: bool = True) -> Stored:
    """Check one input and make its stored value (docs/convert.md); raises Refused.

    A JPEG is checked from its header, then read whole when ``opts.check="decode"``, when
    simplejpeg cannot read it, and before Pillow re-encodes it. ``transcode=False`` leaves a
    progressive JPEG's lossless transcode to baseline to the caller (a worker process)."""
    kind = sniff_codec(data)
    target = output_codec(kind, kind == "webp" and webp_lossless(data), opts)
    keep = opts.store == "passthrough" and opts.resize is None and target == kind
    if kind == "jpeg":
        info, why = jpeg_problem(data, max_pixels=opts.max_pixels, max_scans=opts.max_scans,
                                 max_pixels_per_byte=opts.max_pixels_per_byte)
        if why is not None or info is None:
            raise Refused(why)
        # plain RGB/grayscale JPEGs in upright orientation are stored byte for byte
        if keep and info.components in (1, 3) and info.orientation in (0, 1):
            progressive = info.marker in JPEG_PROGRESSIVE
            fast = jpeg_fast_decodable(data)
            if not fast or (opts.check == "decode" and not (
                    progressive and opts.jpeg == "baseline" and can_transcode())):
                _read_whole(data)
            stored = Stored(data, "jpeg unchanged", "jpeg", (info.width, info.height),
                            slow_jpeg=not fast, progressive=progressive)
            if progressive and opts.jpeg == "baseline" and transcode:
                return transcoded(stored)
            return stored
        _read_whole(data)  # Pillow decodes it below, and would fill damaged data with grey
    unasked = keep  # a lossy re-encode from here on was not asked for: it is named
    keep = keep and kind != "jpeg"  # a JPEG that gets here needs rotation or colour conversion
    if kind == "png" and len(data) >= 24 and data[12:16] == b"IHDR":  # Pillow: only at 2^31
        _too_big(*struct.unpack(">II", data[16:24]), opts)
    try:
        with Image.open(io.BytesIO(data)) as img:
            _too_big(img.size[0], img.size[1], opts)
            if getattr(img, "n_frames", 1) > 1:
                raise Refused(f"{img.n_frames} frames (animated or multi-page): only still "
                              "images are stored; extract the frames first")
            img.load()
            lost = _extra(img)
            if lost and opts.extra_channels == "refuse":
                raise Refused(f"{lost}: storing it would drop data; pass extra_channels='drop' "
                              "(--extra-channels drop) to store its RGB only")
            upright = ImageOps.exif_transpose(img)
            if keep and not lost and upright.size == img.size and \
                    img.getexif().get(0x0112, 1) in (0, 1):
                return Stored(data, f"{kind} unchanged", kind, img.size)
            size, how = upright.size, f"{kind}→{target}"
            if target == "png" and opts.resize is None:
                return Stored(_png(upright, bool(lost)), how, target, size, dropped=lost)
            arr = resized_rgb(upright, opts)
            why = _why_changed(img) if unasked and target in ("jpeg", "webp") else None
    except Image.DecompressionBombError as exc:
        raise Refused(f"decompression bomb refused by Pillow: {exc}") from exc
    except (OSError, ValueError, SyntaxError) as exc:
        if kind == "unknown":
            raise Refused("not an image (unrecognized format)") from exc
        raise Refused(f"corrupt image: {exc}") from exc
    if target == "raw":
        return Stored(np.ascontiguousarray(arr), how, target, size, dropped=lost)
    return Stored(encode_rgb(arr, target, opts.quality), how, target, size, dropped=lost,
                  lossy=why and f"{why}; re-encoded as {target} at quality {opts.quality}")


def _why_changed(img: Image.Image) -> str:
    """Why a JPEG or lossy WebP stored as its own codec could not keep its bytes."""
    orientation = img.getexif().get(0x0112, 1)
    why = [f"EXIF orientation {orientation} turned upright"] if orientation not in (0, 1) else []
    if img.mode not in ("RGB", "L"):
        why.append(f"{img.mode} converted to RGB")
    return ", ".join(why) or "pixels changed"
