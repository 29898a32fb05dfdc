"""Image decoding to RGB uint8, format sniffing, and which decoders are installed (pillow,
pillow-simd, simplejpeg, turbojpeg). A JPEG is decoded whole or not at all: libjpeg-turbo reports
data that ends early (a file cut short) or that it cannot follow (a bad Huffman code) as a warning
and fills the rest with grey; Pillow does the same without a word. Here such a warning makes the
image corrupt (DamagedImageError); a JPEG goes to a fallback decoder only when simplejpeg cannot
read its kind (4:1:0 sampling, CMYK). Every JPEG path checks the header first (:func:`check_jpeg`),
so what a decode may cost is bounded before it starts.

Non-JPEG data to RGB: EXIF orientation is applied; L, LA, 1, P, PA, CMYK, YCbCr and RGBA go
through Pillow's ``convert("RGB")`` (alpha dropped, not composited); 16- and 32-bit integer images
are scaled to 8 bits by their full range and replicated to three channels. (The converter refuses
sources whose alpha or extra channels carry data unless told to drop them.)"""

from __future__ import annotations

import functools
import io
from importlib import metadata
from typing import Any, Callable, TypeVar

import numpy as np
from PIL import Image, ImageOps

from ..errors import BadInputError, CorruptRecordError, DamagedImageError
from .codecs import Buffer, JpegHeader, jpeg_complete, jpeg_header

Image.MAX_IMAGE_PIXELS = 1 << 30  # Pillow's own last-resort guard; the checks below come first

# The decompression-bomb limit: images declaring more pixels are refused before any decode
# allocates (16384² = 268 MP, ~800 MB as RGB). ``convert(max_pixels=)`` records its value in the
# manifest's conversion section.
DEFAULT_MAX_PIXELS = 1 << 28
# Scans a JPEG may hold (libjpeg-turbo's own scan limit, TJPARAM_SCANLIMIT, is off by default):
# every progressive scan visits every block of its components again, so 2,649 near-empty scans
# make a 200 KB 4096² file cost 52 s. Encoders write 1 (baseline) or 6-12 (progressive).
DEFAULT_MAX_SCANS = 100
# A whole Huffman-coded JPEG spends at least one bit on every 8×8 block's DC, so it holds at most
# 512 pixels a byte: a 10 KB file declaring 16000×16000 (25,000 a byte) is cut short or hostile,
# and decoding it would allocate gigabytes for grey. Arithmetic coding has no such floor.
DEFAULT_MAX_PIXELS_PER_BYTE = 512

try:
    import simplejpeg
except ImportError:  # optional: Pillow decodes JPEG when it is missing
    simplejpeg = None
try:  # TurboJPEG 3 (libjpeg-turbo bundled): reads what simplejpeg's API refuses, and says when a
    import turbojpeg  # JPEG is damaged, which Pillow never does. No wheel everywhere (pyproject).
except ImportError:  # pragma: no cover - then Pillow alone is the fallback
    turbojpeg = None

T = TypeVar("T")


@functools.cache
def pillow_flavor() -> str:
    """'pillow-simd' or 'pillow': which distribution provides the ``PIL`` import."""
    try:
        metadata.version("pillow-simd")  # names are normalized: finds Pillow-SIMD too
        return "pillow-simd"
    except metadata.PackageNotFoundError:
        return "pillow"


def jpeg_path() -> str:
    """The JPEG decode+resize path the loader uses: the fastest installed (benchmarks/RESULTS.md:
    pillow-simd with ``draft``, then simplejpeg + torch resize, then stock Pillow)."""
    if pillow_flavor() == "pillow-simd":
        return "pillow-simd"
    return "simplejpeg+torch" if simplejpeg is not None else "pillow"


def decoder_info() -> dict[str, Any]:
    """Which image libraries are active, for logs, `feedpipe doctor` and benchmark reports."""
    return {
        "pil": pillow_flavor(),
        "pil_version": Image.__version__,
        "jpeg_decoder": "simplejpeg" if simplejpeg is not None else pillow_flavor(),
        "jpeg_fallback": jpeg_fallback(),
        "jpeg_loader_path": jpeg_path(),
        "simplejpeg": getattr(simplejpeg, "__version__", None) if simplejpeg else None,
    }


def jpeg_fallback() -> str:
    """What decodes the JPEGs simplejpeg cannot read: turbojpeg when installed (it reports damaged
    data), else Pillow (which cannot tell a JPEG cut short: it fills the rest with grey)."""
    return "turbojpeg" if turbojpeg is not None else pillow_flavor()


def pil_to_rgb(img: Image.Image) -> np.ndarray:
    """Apply EXIF orientation and convert any Pillow mode to an H×W×3 uint8 array (rules above)."""
    img = ImageOps.exif_transpose(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        arr = np.asarray(img)
        if img.mode == "F":
            gray = np.clip(arr, 0, 255).astype(np.uint8)
        else:
            shift = 8 if img.mode.startswith("I;16") or arr.max(initial=0) < 65536 else 24
            gray = (arr.astype(np.uint32) >> shift).clip(0, 255).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    return np.asarray(img if img.mode == "RGB" else img.convert("RGB"))


_MAGIC = ((b"\xff\xd8\xff", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF87a", "gif"),
          (b"GIF89a", "gif"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"), (b"BM", "bmp"),
          (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "jp2"), (b"\xffO\xffQ", "jp2"))


def sniff_codec(data: Buffer) -> str:
    """The image format from its magic bytes (never the file name): jpeg, png, webp, gif, tiff,
    bmp, jp2, pnm, or unknown."""
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


def jpeg_problem(data: Buffer, *, max_pixels: int | None = DEFAULT_MAX_PIXELS,
                 max_scans: int | None = DEFAULT_MAX_SCANS,
                 max_pixels_per_byte: int | None = DEFAULT_MAX_PIXELS_PER_BYTE
                 ) -> tuple[JpegHeader | None, str | None]:
    """:func:`check_jpeg`'s checks: (the header, None) when they pass, else (the header or None,
    why the JPEG is refused). A limit of None is not checked."""
    header = jpeg_header(data)
    if header is None:
        return None, "damaged JPEG header (no frame header before the first scan)"
    w, h = header.width, header.height
    if header.precision != 8:
        return header, (f"{header.precision}-bit JPEG: simplejpeg, libjpeg-turbo's 8-bit API "
                        "and Pillow read 8-bit JPEGs only; convert it to 8 bits (or PNG) first")
    if w == 0 or h == 0:
        dnl = " (its height given after the first scan, in a DNL marker)" if w else ""
        return header, (f"JPEG frame header declares {w}x{h}{dnl}: libjpeg-turbo and Pillow "
                        "cannot decode it; re-encode it")
    if max_pixels is not None and w * h > max_pixels:
        return header, (f"declares {w}x{h} = {w * h:,} pixels, over the limit of "
                        f"{max_pixels:,} (max_pixels={max_pixels:,}, --max-pixels); raise it "
                        "if the image is real")
    if header.scans == 0 or not jpeg_complete(data):
        return header, "truncated JPEG (no end-of-image marker after its last scan)"
    if max_scans is not None and header.scans > max_scans:
        return header, (f"{header.scans:,} scans, over the limit of {max_scans:,} (every scan "
                        f"decodes every block again: a scan bomb?) (max_scans={max_scans:,}, "
                        "--max-scans); raise it if the image is real")
    if max_pixels_per_byte is not None and w * h > max_pixels_per_byte * len(data):
        return header, (f"declares {w}x{h} = {w * h:,} pixels in {len(data):,} bytes, "
                        f"{w * h // len(data):,} a byte; a whole Huffman-coded JPEG holds at "
                        "most 512 (a bit per 8x8 block): cut short or hostile "
                        f"(max_pixels_per_byte={max_pixels_per_byte:,}, "
                        "--max-pixels-per-byte); raise it for an arithmetic-coded JPEG")
    return header, None


def check_jpeg(data: Buffer, what: str = "image", *,
               max_pixels: int | None = DEFAULT_MAX_PIXELS,
               max_scans: int | None = DEFAULT_MAX_SCANS,
               max_pixels_per_byte: int | None = DEFAULT_MAX_PIXELS_PER_BYTE,
               error: type[Exception] = BadInputError) -> JpegHeader:
    """The header checks (:func:`jpeg_problem`) every JPEG decode path runs before decoding, so
    what a decode may cost is bounded first; the header, or ``error`` naming ``what`` and the
    bound. Passing them does not prove the entropy data whole: decoders still decode strictly."""
    header, why = jpeg_problem(data, max_pixels=max_pixels, max_scans=max_scans,
                               max_pixels_per_byte=max_pixels_per_byte)
    if why is not None:
        raise error(f"{what}: {why}")
    assert header is not None
    return header


def strict_decode(decode: Callable[[bool], T], what: str, last: bool = False) -> T | None:
    """``decode(True)`` (strict: libjpeg-turbo's warnings raise). None when the decoder cannot
    read the JPEG at all (its kind: a fallback may; with ``last``, a BadInputError);
    DamagedImageError when it reads it only by ignoring a warning: its pixels from there on are
    made up, so the image is corrupt, never handed to a more forgiving decoder."""
    try:
        return decode(True)
    except (ValueError, RuntimeError) as exc:
        try:
            decode(False)
        except (ValueError, RuntimeError):
            if last:
                raise BadInputError(f"{what}: cannot decode JPEG (libjpeg-turbo: {exc})"
                                    ) from exc
            return None
        raise DamagedImageError(f"{what}: damaged JPEG data, it does not decode whole "
                                f"(libjpeg-turbo: {exc})") from exc


def decode_jpeg_fallback(data: Buffer, what: str = "image",
                         max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """A JPEG simplejpeg cannot read (4:1:0 sampling, CMYK) → H×W×3 uint8: turbojpeg decodes it
    strictly (one only Pillow converts, CMYK, is checked whole by turbojpeg first, then decoded
    by Pillow). Without turbojpeg, Pillow decodes it, and cannot tell damaged data."""
    if turbojpeg is None:
        return decode_with_pillow(data, what, max_pixels)
    rgb = strict_decode(lambda strict: np.asarray(turbojpeg.decompress(
        data, turbojpeg.PF.RGB, raise_on_warnings=strict)), what)
    if rgb is not None:
        return rgb
    strict_decode(lambda strict: turbojpeg.decompress(data, raise_on_warnings=strict), what,
                  last=True)
    return decode_with_pillow(data, what, max_pixels)


def decode_with_pillow(data: Buffer, what: str = "image",
                       max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Any format Pillow reads → H×W×3 uint8 (rules above); a JPEG only after libjpeg-turbo
    found it whole: Pillow decodes a JPEG cut short to grey without a word."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            check_pixels(img.size[0], img.size[1], max_pixels, what)
            return pil_to_rgb(img)
    except Image.UnidentifiedImageError as exc:  # its message names a BytesIO object
        raise BadInputError(f"{what}: cannot decode image: not a format Pillow reads "
                            f"({sniff_codec(data)} by its first bytes)") from exc
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise BadInputError(f"{what}: cannot decode image: {exc}") from exc


def jpeg_fast_decodable(data: bytes | memoryview) -> bool:
    """True when simplejpeg (the loader's fast JPEG path) reads this JPEG's header; False when
    only the fallback decoder can (or simplejpeg is not installed)."""
    try:
        return simplejpeg is not None and bool(simplejpeg.decode_jpeg_header(data))
    except ValueError:
        return False


def decode_jpeg(data: Buffer, what: str = "image", *,
                max_pixels: int | None = DEFAULT_MAX_PIXELS,
                max_scans: int | None = DEFAULT_MAX_SCANS,
                max_pixels_per_byte: int | None = DEFAULT_MAX_PIXELS_PER_BYTE) -> np.ndarray:
    """JPEG bytes → H×W×3 uint8, whole or a BadInputError: :func:`check_jpeg`, then simplejpeg
    strictly, then :func:`decode_jpeg_fallback` for a JPEG whose kind simplejpeg cannot read."""
    check_jpeg(data, what, max_pixels=max_pixels, max_scans=max_scans,
               max_pixels_per_byte=max_pixels_per_byte)
    if simplejpeg is not None:
        rgb: np.ndarray | None = strict_decode(
            lambda strict: simplejpeg.decode_jpeg(data, colorspace="RGB", strict=strict), what)
        if rgb is not None:
            return rgb
    return decode_jpeg_fallback(data, what, max_pixels)


def read_jpeg_whole(data: Buffer, what: str = "image") -> str:
    """Read every scan of a JPEG that passed :func:`check_jpeg` as cheaply as possible (simplejpeg
    at 1/8 scale in grey: all entropy data, DC-only IDCT); the decoder that read it, or
    BadInputError."""
    if simplejpeg is not None and strict_decode(lambda strict: simplejpeg.decode_jpeg(
            data, colorspace="GRAY", min_factor=8, min_height=1, min_width=1, strict=strict),
            what) is not None:
        return "simplejpeg"
    decode_jpeg_fallback(data, what, None)
    return jpeg_fallback()


def decode_rgb(data: bytes | memoryview, codec: str, what: str = "image",
               max_pixels: int | None = DEFAULT_MAX_PIXELS, *,
               max_scans: int | None = DEFAULT_MAX_SCANS,
               max_pixels_per_byte: int | None = DEFAULT_MAX_PIXELS_PER_BYTE) -> np.ndarray:
    """Encoded image bytes → H×W×3 uint8 (``codec="mixed"``: sniffed); BadInputError when the
    image is damaged or no decoder reads it."""
    if codec == "mixed":
        codec = sniff_codec(data)
    if codec == "jpeg":
        return decode_jpeg(data, what, max_pixels=max_pixels, max_scans=max_scans,
                           max_pixels_per_byte=max_pixels_per_byte)
    return decode_with_pillow(data, what, max_pixels)


def encode_rgb(array: np.ndarray, codec: str, quality: int) -> bytes:
    """Encode an H×W×3 uint8 array with Pillow (JPEG at ``quality``, PNG lossless, WebP)."""
    options = {"jpeg": {"quality": quality}, "png": {"compress_level": 1},
               "webp": {"quality": quality}}
    if codec not in options:
        raise ValueError(f"unknown image codec {codec!r}; use jpeg, png or webp")
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array), "RGB").save(out, codec.upper(), **options[codec])
    return out.getvalue()


# --- segmentation masks: lossless index PNGs -------------------------------------------------------

def encode_mask_png(arr: np.ndarray) -> bytes:
    """Lossless PNG of an H×W uint8 (mode L) or uint16 (mode I;16) index array."""
    out = io.BytesIO()  # Pillow picks mode L for uint8 and I;16 for uint16
    Image.fromarray(np.ascontiguousarray(arr)).save(out, "PNG", compress_level=1)
    return out.getvalue()


def decode_mask_png(data: Buffer, what: str, *, png_only: bool = True,
                    max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """PNG (``png_only=False``: any lossless format Pillow reads) → H×W index array: L/P/1 →
    uint8 (palette indices, not colours), I;16 → uint16; over ``max_pixels``, refused."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            if png_only and im.format != "PNG":
                raise ValueError(f"not a PNG ({im.format})")
            check_pixels(im.size[0], im.size[1], max_pixels, what, CorruptRecordError)
            if im.mode in ("L", "P", "1"):
                return np.array(im, dtype=np.uint8)
            if im.mode in ("I;16", "I;16B", "I;16L", "I"):
                arr = np.asarray(im)
                if arr.size and (arr.min() < 0 or arr.max() > 0xFFFF):
                    raise ValueError("mask index out of uint16 range")
                return arr.astype(np.uint16)
            raise ValueError(f"{im.format} mode {im.mode} is not an index mask "
                             "(use L, P, 1 or I;16)")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise CorruptRecordError(f"{what}: cannot decode mask: {exc}") from exc
