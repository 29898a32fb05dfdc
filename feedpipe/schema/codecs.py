"""Safe byte-level codecs: npy without pickle, the LMDB record layout, cheap JPEG integrity checks.
Nothing here can execute stored data: npy is read without pickle and object dtypes are refused on
write and read."""

from __future__ import annotations

import ast
import io
import math
import re
import struct
import warnings
from functools import lru_cache
from typing import NamedTuple, Sequence

import numpy as np

from ..errors import CorruptRecordError, SampleError, UnsafeDataError

Buffer = bytes | bytearray | memoryview

try:  # ISA-L's crc32 is zlib's (same polynomial, same values), several times faster (PCLMUL;
    from isal.isal_zlib import crc32  # measured: benchmarks/RESULTS.md, "Figures the code cites")
except ImportError:  # pragma: no cover - a platform without an isal wheel: same checksums
    from zlib import crc32

_NPY_MAGIC = b"\x93NUMPY"


def check_dtype(dtype: np.dtype, what: str) -> None:
    """Refuse dtypes that would hold Python objects (and so need pickle to store)."""
    if dtype.hasobject:
        raise UnsafeDataError(f"{what}: object dtype {dtype} cannot be stored or read safely; "
                              "use a numeric dtype")


def npy_encode(array: np.ndarray) -> bytes:
    """Serialize an array in the npy format (C order, no pickle)."""
    array = np.asarray(array)
    check_dtype(array.dtype, "npy_encode")
    out = io.BytesIO()
    np.lib.format.write_array(out, np.asarray(array, order="C"), allow_pickle=False)  # keeps 0-d
    return out.getvalue()


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> tuple[bytes, np.dtype, tuple[int, ...]]:
    """(the header :func:`npy_encode` writes, dtype, shape): :func:`npy_decode`'s fast path."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": tuple(shape)})
    return out.getvalue(), np.dtype(dtype), tuple(shape)


_NPY_HEADER = re.compile(r"\{'descr': '([<>|=][a-zA-Z]\d*)', 'fortran_order': (False|True), "
                         r"'shape': \(([\d, ]*)\), \}\s*\Z")


def npy_decode(buf: Buffer, what: str = "array",
               expected: tuple[bytes, np.dtype, tuple[int, ...]] | None = None) -> np.ndarray:
    """Parse npy bytes into an array that views ``buf`` (zero-copy, read-only); a header equal
    to ``expected``'s (a fixed-shape field's, :func:`npy_header`) is not parsed again."""
    mv = memoryview(buf)
    if expected is not None and mv[: len(expected[0])] == expected[0]:
        hdr = (expected[2], False, expected[1])
        offset = len(expected[0])
    else:
        if bytes(mv[:6]) != _NPY_MAGIC or len(mv) < 10:
            raise CorruptRecordError(f"{what}: not npy data (bad magic)")
        major = mv[6]
        if major not in (1, 2, 3):
            raise CorruptRecordError(f"{what}: unsupported npy version {major}")
        end = 10 if major == 1 else 12  # the header's length: a u16 (version 1) or a u32
        if len(mv) < end:
            raise CorruptRecordError(f"{what}: npy header cut short")
        (hlen,) = struct.unpack_from("<H" if major == 1 else "<I", mv, 8)
        offset = end + hlen
        try:
            text = bytes(mv[offset - hlen: offset]).decode("latin1")
            m = _NPY_HEADER.match(text)  # the canonical header numpy writes: no literal parsing
            if m is not None:
                hdr = (tuple(int(d) for d in m[3].split(",") if d.strip()), m[2] == "True",
                       np.dtype(m[1]))
            else:
                with warnings.catch_warnings():  # a damaged header's "\q": no SyntaxWarning
                    warnings.simplefilter("ignore")
                    d = ast.literal_eval(text)  # literals only: never executes code
                hdr = (tuple(d["shape"]), bool(d["fortran_order"]), np.dtype(d["descr"]))
        except UnsafeDataError:
            raise
        except Exception as exc:
            raise CorruptRecordError(f"{what}: malformed npy header") from exc
    shape, fortran, dtype = hdr
    check_dtype(dtype, what)
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise CorruptRecordError(f"{what}: npy shape {shape} is not a tuple of sizes")
    count = math.prod(shape)  # Python ints: a huge declared shape cannot wrap around
    if len(mv) - offset != count * dtype.itemsize:
        raise CorruptRecordError(f"{what}: npy payload has {len(mv) - offset} bytes, header says "
                                 f"{count * dtype.itemsize}")
    try:
        arr = np.frombuffer(mv, dtype=dtype, count=count, offset=offset)
    except ValueError as exc:  # a zero-size dtype ('|V0')
        raise CorruptRecordError(f"{what}: npy data cannot be read: {exc}") from exc
    return arr.reshape(shape, order="F" if fortran else "C")


# --- LMDB record layout -------------------------------------------------------------------------
# A record is one LMDB value holding every field of a sample, in schema order:
#   v2: b"FPR2" | u32 nfields | u32 length[nfields] | u32 crc32[nfields] | payload[0] | ...
#   v1: b"FPR1" | u32 nfields | u32 length[nfields] | payload[0] | ...  (no checksums)
# All integers little-endian. A payload is at most 4 GiB - 1 (u32 lengths). crc32[k] is
# zlib's crc32 of payload k: a flipped bit anywhere in a payload (JPEG entropy data decodes "fine"
# to wrong pixels) fails its field's check; one in the header breaks the length sum or a crc.
RECORD_MAGIC = b"FPR2"
RECORD_MAGIC_V1 = b"FPR1"
_U32 = struct.Struct("<I")


@lru_cache(maxsize=64)
def _u32s(n: int) -> struct.Struct:
    """``n`` little-endian uint32s (a record header's lengths, or its crcs), compiled once."""
    return struct.Struct(f"<{n}I")


def pack_record(payloads: Sequence[Buffer]) -> bytes:
    """Join field payloads into one version-2 record (see the layout above)."""
    lengths = [len(p) for p in payloads]
    if any(n >= 2**32 for n in lengths):
        raise SampleError("a field payload exceeds 4 GiB; record lengths are stored as uint32")
    n = len(payloads)
    head = (RECORD_MAGIC + _U32.pack(n) + struct.pack(f"<{n}I", *lengths)
            + struct.pack(f"<{n}I", *(crc32(p) for p in payloads)))
    return b"".join([head, *payloads])


def unpack_record(buf: Buffer, nfields: int, what: str = "record", *, version: int = 2,
                  check: Sequence[int] | None = None,
                  names: Sequence[str] = ()) -> list[memoryview]:
    """Split a record into zero-copy payload views, checking magic, field count and lengths,
    and (version 2) the crc32 of the payloads listed in ``check`` (default: all); ``names``
    name the fields in messages."""
    mv = memoryview(buf)
    crcs = version >= 2
    magic = RECORD_MAGIC if crcs else RECORD_MAGIC_V1
    if mv[:4] != magic:
        raise CorruptRecordError(f"{what}: bad record magic (expected {magic!r})")
    pos = 8 + (8 if crcs else 4) * nfields
    if len(mv) < pos:
        raise CorruptRecordError(f"{what}: record of {len(mv)} bytes is shorter than its header")
    (n,) = _U32.unpack_from(mv, 4)
    if n != nfields:
        raise CorruptRecordError(f"{what}: record has {n} fields, schema has {nfields}")
    words = _u32s(n)
    lengths = words.unpack_from(mv, 8)
    if pos + sum(lengths) != len(mv):
        raise CorruptRecordError(f"{what}: record length {len(mv)} does not match its header")
    out = []
    for length in lengths:
        out.append(mv[pos: pos + length])
        pos += length
    if crcs:
        stored = words.unpack_from(mv, 8 + 4 * n)
        for k in range(n) if check is None else check:
            if crc32(out[k]) != stored[k]:
                name = repr(names[k]) if k < len(names) else k
                raise CorruptRecordError(f"{what}: field {name} fails its checksum (crc32 "
                                         f"{crc32(out[k]):08x}, stored {stored[k]:08x})")
    return out


# --- JPEG integrity -----------------------------------------------------------------------------

def jpeg_complete(data: Buffer) -> bool:
    """Cheap truncation check: an end-of-image marker after the last start-of-scan marker (data
    byte-stuffs 0xFF, so that FFD9 is the real EOI, not an embedded EXIF thumbnail's)."""
    b = bytes(data) if not isinstance(data, bytes) else data
    if not b.startswith(b"\xff\xd8"):
        return False
    if b.rstrip(b"\x00\r\n ").endswith(b"\xff\xd9"):
        return True
    sos = b.rfind(b"\xff\xda")
    return sos != -1 and b.find(b"\xff\xd9", sos + 2) != -1


_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


#: start-of-frame markers of progressive JPEGs: SOF2 (Huffman) and SOF10 (arithmetic coding)
JPEG_PROGRESSIVE = frozenset({0xC2, 0xCA})
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # markers without a length (TEM, RSTn)
#: sequential frames (baseline, extended, lossless; Huffman or arithmetic): one scan holding
#: every component is the whole image
_SEQUENTIAL = frozenset({0xC0, 0xC1, 0xC3, 0xC9, 0xCB})


class JpegHeader(NamedTuple):
    """What a JPEG's markers say before its first scan is decoded (:func:`jpeg_header`)."""

    width: int
    height: int  # 0: the height comes in a DNL marker after the first scan
    components: int
    orientation: int  # EXIF orientation, 1 when absent
    marker: int  # the frame header's: 0xC0 baseline, 0xC2 progressive, ... (JPEG_PROGRESSIVE)
    precision: int  # bits per sample: 8 for nearly every JPEG, 12 or 16 for a few
    scans: int  # start-of-scan markers: 0 when the file ends before its first scan


def jpeg_info(data: Buffer) -> tuple[int, int, int, int] | None:
    """(width, height, components, EXIF orientation) of :func:`jpeg_header`; None when the
    header is damaged. Far cheaper than opening the file with Pillow (benchmarks/RESULTS.md)."""
    header = jpeg_header(data)
    return None if header is None else header[:4]


def jpeg_frame(data: Buffer) -> tuple[int, int, int, int, int] | None:
    """:func:`jpeg_info` and the frame header's marker (0xC0 baseline, 0xC2 progressive, ...:
    :data:`JPEG_PROGRESSIVE`), from the same one pass over the markers."""
    header = jpeg_header(data)
    return None if header is None else header[:5]


def jpeg_header(data: Buffer) -> JpegHeader | None:
    """The markers up to the first scan, parsed without decoding anything; None when there is
    no frame header before the first scan (or the header is damaged). ``scans`` counts FF DA
    markers (data byte-stuffs 0xFF; one in a comment between scans makes it an upper bound),
    except after a sequential frame's first scan holding every component: libjpeg refuses a
    second one, so a baseline JPEG's data is not searched."""
    b = bytes(data) if not isinstance(data, bytes) else data
    if not b.startswith(b"\xff\xd8"):
        return None
    pos, n, orientation = 2, len(b), 1
    frame: tuple[int, int, int, int, int] | None = None  # width, height, components, marker, bits
    while pos + 4 <= n:
        if b[pos] != 0xFF:
            break
        marker = b[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        length = b[pos + 2] << 8 | b[pos + 3]
        if length < 2 or pos + 2 + length > n:
            break
        if marker == 0xE1 and b[pos + 4: pos + 10] == b"Exif\x00\x00":
            orientation = _exif_orientation(b[pos + 10: pos + 2 + length])
        elif marker in _SOF and frame is None:
            if length < 8:
                return None
            height, width = struct.unpack_from(">HH", b, pos + 5)
            frame = width, height, b[pos + 9], marker, b[pos + 4]
        elif marker == 0xDA:  # the first scan: its header says whether more can follow
            if frame is None:
                return None
            one = frame[3] in _SEQUENTIAL and length > 2 and b[pos + 4] >= frame[2]
            scans = 1 if one else b.count(b"\xff\xda", pos)
            return JpegHeader(*frame[:3], orientation, *frame[3:], scans)
        pos += 2 + length
    if frame is None:
        return None
    return JpegHeader(*frame[:3], orientation, *frame[3:], b.count(b"\xff\xda", pos))


def _exif_orientation(tiff: bytes) -> int:
    """Tag 0x0112 of IFD0 in a TIFF-structured EXIF block; 1 when absent or unreadable."""
    try:
        endian = {b"II": "<", b"MM": ">"}[tiff[:2]]
        (ifd,) = struct.unpack_from(endian + "I", tiff, 4)
        (count,) = struct.unpack_from(endian + "H", tiff, ifd)
        for k in range(count):
            tag, typ, _, value = struct.unpack_from(endian + "HHIH", tiff, ifd + 2 + 12 * k)
            if tag == 0x0112:
                return int(value) if typ == 3 else 1
    except (KeyError, struct.error):
        pass
    return 1
