"""Image decoding to RGB uint8, format sniffing, and detection of the decoders installed (pillow,
pillow-simd, simplejpeg).

Documented mode conversions (used when decoding stored non-JPEG data to a batch):
EXIF orientation is applied; grayscale (L, LA, 1), palette (P, PA), CMYK, YCbCr and RGBA go through
Pillow's ``convert("RGB")`` (alpha is dropped, not composited); 16-bit and 32-bit integer images are
scaled to 8 bits by their full range (``value >> 8`` for 16-bit) and replicated to three channels.
The converter refuses inputs whose alpha or extra channels carry data unless told to drop them, so
the stored bytes hold everything the source held.
"""

from __future__ import annotations

import functools
import io
from importlib import metadata
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from ..errors import BadInputError, CorruptRecordError
from .codecs import Buffer

Image.MAX_IMAGE_PIXELS = 1 << 30  # Pillow's own last-resort guard; the checks below come first

# The decompression-bomb limit: images declaring more pixels are refused before any decode
# allocates (16384² = 268 MP, ~800 MB as RGB). ``convert(max_pixels=)`` records its value in the
# manifest's conversion section.
DEFAULT_MAX_PIXELS = 1 << 28

CODEC_EXT = {"jpeg": "jpg", "png": "png", "webp": "webp", "mixed": "img"}

try:
    import simplejpeg
except ImportError:  # optional: Pillow decodes JPEG when it is missing
    simplejpeg = None


@functools.cache
def pillow_flavor() -> str:
    """'pillow-simd' or 'pillow': which distribution provides the ``PIL`` import."""
    for dist in ("pillow-simd", "Pillow-SIMD"):
        try:
            metadata.version(dist)
            return "pillow-simd"
        except metadata.PackageNotFoundError:
            pass
    return "pillow"


def jpeg_path() -> str:
    """The JPEG decode+resize path the loader uses: the fastest one installed.

    Fastest first, as measured for 500×375 → 224² on one core (benchmarks/RESULTS.md):
    pillow-simd with ``draft``, simplejpeg + torch resize, stock Pillow.
    """
    if pillow_flavor() == "pillow-simd":
        return "pillow-simd"
    return "simplejpeg+torch" if simplejpeg is not None else "pillow"


def decoder_info() -> dict[str, Any]:
    """Which image libraries are active, for logs, `feedpipe doctor` and benchmark reports."""
    import PIL

    return {
        "pil": pillow_flavor(),
        "pil_version": PIL.__version__,
        "jpeg_decoder": "simplejpeg" if simplejpeg is not None else pillow_flavor(),
        "jpeg_loader_path": jpeg_path(),
        "simplejpeg": getattr(simplejpeg, "__version__", None) if simplejpeg else None,
    }


def pil_to_rgb(img: Image.Image) -> np.ndarray:
    """Apply EXIF orientation and convert any Pillow mode to an H×W×3 uint8 array (rules above)."""
    img = ImageOps.exif_transpose(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        arr = np.asarray(img)
        shift = 8 if img.mode.startswith("I;16") or arr.max(initial=0) < 65536 else 24
        gray = (arr.astype(np.uint32) >> shift).clip(0, 255).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if img.mode == "F":
        arr = np.asarray(img)
        gray = np.clip(arr, 0, 255).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if img.mode != "RGB":
        img = img.convert("RGB")
    return np.asarray(img)


_MAGIC = ((b"\xff\xd8\xff", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF87a", "gif"),
          (b"GIF89a", "gif"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"), (b"BM", "bmp"),
          (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "jp2"), (b"\xffO\xffQ", "jp2"))


def sniff_codec(data: bytes | memoryview) -> str:
    """The image format from its magic bytes: jpeg, png, webp, gif, tiff, bmp, jp2, pnm, or unknown.

    Stored records of a ``"mixed"`` image field are told apart this way (never by file name).
    """
    head = bytes(data[:16])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if len(head) > 2 and head[0] == 0x50 and head[1] in b"1234567" and head[2] in b" \t\r\n#":
        return "pnm"
    return "unknown"


def webp_lossless(data: bytes | memoryview) -> bool:
    """True when a WebP's image chunk is VP8L (lossless); VP8 (lossy) or unreadable is False."""
    b = bytes(data)
    pos = 12
    while pos + 8 <= len(b):
        tag, size = b[pos: pos + 4], int.from_bytes(b[pos + 4: pos + 8], "little")
        if tag in (b"VP8L", b"VP8 "):
            return tag == b"VP8L"
        if tag == b"ANMF":  # animation frame: its sub-chunks follow its 16-byte header
            pos += 8 + 16
            continue
        pos += 8 + size + (size & 1)
    return False


def check_pixels(width: int, height: int, max_pixels: int | None, what: str,
                 error: type[Exception] = BadInputError) -> None:
    """Refuse an image that declares more than ``max_pixels`` pixels (a decompression bomb)."""
    if max_pixels is not None and width * height > max_pixels:
        raise error(f"{what}: declares {width}x{height} = {width * height:,} pixels, over "
                    f"the limit of {max_pixels:,} (max_pixels={max_pixels:,}, "
                    "--max-pixels); raise it if the image is real")


def decode_with_pillow(data: bytes | memoryview, what: str = "image",
                       max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Any format Pillow reads → H×W×3 uint8 (rules above); the fallback for JPEGs that the fast
    decoder refuses (e.g. 4:1:0 chroma subsampling), so it is safe to call on any image bytes."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            check_pixels(img.size[0], img.size[1], max_pixels, what)
            return pil_to_rgb(img)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise BadInputError(f"{what}: cannot decode image: {exc}") from exc


def jpeg_fast_decodable(data: bytes | memoryview) -> bool:
    """True when simplejpeg (the loader's fast JPEG path) reads this JPEG's header; False when
    only the Pillow fallback can (or simplejpeg is not installed)."""
    if simplejpeg is None:
        return False
    try:
        simplejpeg.decode_jpeg_header(data)
        return True
    except ValueError:
        return False


def decode_rgb(data: bytes | memoryview, codec: str, what: str = "image",
               max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode encoded image bytes to H×W×3 uint8.

    ``codec="mixed"`` sniffs the magic bytes. JPEG goes through simplejpeg when installed and falls
    back to Pillow, per image, for whatever simplejpeg refuses; an image is corrupt (BadInputError)
    only when no decoder reads it.
    """
    if codec == "mixed":
        codec = sniff_codec(data)
    if codec == "jpeg" and simplejpeg is not None:
        try:
            w, h = simplejpeg.decode_jpeg_header(data)[1::-1]
        except ValueError:
            return decode_with_pillow(data, what, max_pixels)  # e.g. 4:1:0 subsampling
        check_pixels(w, h, max_pixels, what)
        try:
            rgb: np.ndarray = simplejpeg.decode_jpeg(data, colorspace="RGB")
            return rgb
        except ValueError:
            return decode_with_pillow(data, what, max_pixels)
    return decode_with_pillow(data, what, max_pixels)


def encode_rgb(array: np.ndarray, codec: str, quality: int) -> bytes:
    """Encode an H×W×3 uint8 array with Pillow (JPEG at ``quality``, PNG lossless, WebP)."""
    out = io.BytesIO()
    img = Image.fromarray(np.ascontiguousarray(array), "RGB")
    if codec == "jpeg":
        img.save(out, "JPEG", quality=quality)
    elif codec == "png":
        img.save(out, "PNG", compress_level=1)
    elif codec == "webp":
        img.save(out, "WEBP", quality=quality)
    else:
        raise ValueError(f"unknown image codec {codec!r}; use jpeg, png or webp")
    return out.getvalue()


# --- segmentation masks: lossless index PNGs -------------------------------------------------------

def encode_mask_png(arr: np.ndarray) -> bytes:
    """Lossless PNG of an H×W uint8 (mode L) or uint16 (mode I;16) index array."""
    out = io.BytesIO()  # Pillow picks mode L for uint8 and I;16 for uint16
    Image.fromarray(np.ascontiguousarray(arr)).save(out, "PNG", compress_level=1)
    return out.getvalue()


def decode_mask_png(data: Buffer, what: str, *, png_only: bool = True,
                    max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """PNG → H×W index array: L/P/1 → uint8 (palette indices, not colours), I;16 → uint16.

    The one mask decoder: stored masks (PNG only) and the converters' mask files
    (``png_only=False``: any lossless format Pillow reads, e.g. TIFF, BMP). A mask whose header
    declares more than ``max_pixels`` is refused before it is decoded (CorruptRecordError)."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            if png_only and im.format != "PNG":
                raise ValueError(f"not a PNG ({im.format})")
            check_pixels(im.size[0], im.size[1], max_pixels, what, CorruptRecordError)
            if im.mode in ("L", "P"):
                indices: np.ndarray = np.asarray(im, dtype=np.uint8).copy()
                return indices
            if im.mode == "1":
                return np.asarray(im, dtype=np.uint8)
            if im.mode in ("I;16", "I;16B", "I;16L", "I"):
                arr = np.asarray(im)
                if arr.size and (arr.min() < 0 or arr.max() > 0xFFFF):
                    raise ValueError("mask index out of uint16 range")
                return arr.astype(np.uint16)
            raise ValueError(f"{im.format} mode {im.mode} is not an index mask "
                             "(use L, P, 1 or I;16)")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise CorruptRecordError(f"{what}: cannot decode mask: {exc}") from exc
