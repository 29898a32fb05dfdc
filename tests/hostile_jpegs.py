"""Damaged and hostile JPEGs made from scratch for the tests (no torch: the heavy fault tests'
subprocesses import this too). Each is what a careless download or an adversary hands a converter:
a file cut short with its end marker put back, damaged entropy data, a 12-bit or DNL frame, a
header that claims far more pixels than the file holds, and a valid file of thousands of scans."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
from PIL import Image

SOI, EOI = b"\xff\xd8", b"\xff\xd9"


def photo(w: int = 320, h: int = 240, seed: int = 0) -> np.ndarray:
    """An H×W×3 uint8 image with gradients and noise (compresses like a photo, not like flat)."""
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // max(w, 1), y * 255 // max(h, 1), (x + y) * 3 % 256], -1)
    noise = np.random.default_rng(seed).integers(0, 40, rgb.shape)
    return (rgb + noise).clip(0, 255).astype(np.uint8)


def big_progressive(side: int, quality: int = 75) -> bytes:
    """A progressive JPEG of side² pixels: a small photo scaled up (smooth, so a few MB even at
    16384², as large web or scanner images are), made without holding more than the image."""
    img = Image.fromarray(photo(512, 512, seed=side)).resize((side, side), Image.BICUBIC)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality, progressive=True)
    return out.getvalue()


def encode(rgb: np.ndarray, **save: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "JPEG", **{"quality": 90, **save})
    return out.getvalue()


def cut_with_eoi(jpeg: bytes, keep: float = 1 / 3) -> bytes:
    """The first ``keep`` of a JPEG with an end-of-image marker put back: the header checks pass,
    the decoder runs out of data and fills the rest with grey."""
    return jpeg[: int(len(jpeg) * keep)] + EOI


def entropy_damaged(jpeg: bytes) -> bytes:
    """600 bytes cut from the middle of the scan data; headers and end marker intact."""
    mid = (jpeg.rfind(b"\xff\xda") + len(jpeg)) // 2
    return jpeg[:mid] + jpeg[mid + 600:]


def _sof(jpeg: bytes) -> int:
    """Offset of the frame header marker (SOF0 or SOF2) of a Pillow-written JPEG."""
    return min(i for i in (jpeg.find(b"\xff\xc0"), jpeg.find(b"\xff\xc2")) if i > 0)


def twelve_bit(jpeg: bytes) -> bytes:
    """The frame header says 12 bits per sample (as a 12-bit camera or medical file does)."""
    i = _sof(jpeg)
    return jpeg[: i + 4] + b"\x0c" + jpeg[i + 5:]


def dnl(jpeg: bytes) -> bytes:
    """Height 0 in the frame header, the height given in a DNL marker after the first scan."""
    i = _sof(jpeg)
    height = jpeg[i + 5: i + 7]
    eoi = jpeg.rfind(EOI)
    return jpeg[: i + 5] + b"\x00\x00" + jpeg[i + 7: eoi] + b"\xff\xdc\x00\x04" + height + EOI


def claims(jpeg: bytes, width: int, height: int) -> bytes:
    """The frame header declares ``width``×``height``; the data is the small image's."""
    i = _sof(jpeg)
    return jpeg[: i + 5] + struct.pack(">HH", height, width) + jpeg[i + 9:]


class _Bits:
    """An entropy-coded segment: bits MSB first, 0xFF stuffed, padded with 1-bits at the end."""

    def __init__(self) -> None:
        self.out, self.acc, self.n = bytearray(), 0, 0

    def put(self, value: int, length: int) -> None:
        self.acc, self.n = (self.acc << length) | value, self.n + length
        while self.n >= 8:
            self.n -= 8
            byte = (self.acc >> self.n) & 0xFF
            self.out += b"\xff\x00" if byte == 0xFF else bytes([byte])
        self.acc &= (1 << self.n) - 1

    def done(self) -> bytes:
        if self.n:
            self.put((1 << (8 - self.n)) - 1, 8 - self.n)
        return bytes(self.out)


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def _eob_runs(bits: _Bits, blocks: int) -> None:
    """All-zero AC bands of ``blocks`` blocks as end-of-band runs (EOBr: symbol r<<4, r bits)."""
    while blocks:
        run = min(blocks, 32767)
        r = run.bit_length() - 1
        bits.put(r, 4)  # the AC table gives symbol r<<4 the 4-bit code r (see scan_bomb)
        if r:
            bits.put(run - (1 << r), r)
        blocks -= run


def scan_bomb(width: int, height: int, components: int = 3, level: int = 200,
              al: int = 13) -> bytes:
    """A valid progressive JPEG of a flat image (every pixel ``level``) in 1 + 63·(al+1) scans per
    component: a DC scan, then each AC coefficient alone in a first scan at successive
    approximation ``al`` and ``al`` refinement scans down to 0. Each scan is nearly empty (its
    blocks are all zero: end-of-band runs), but a decoder visits every block of the component
    in every one of them: 2,647 scans (components=3) for a few hundred kB."""
    blocks = -(-width // 8) * -(-height // 8)
    dc = (level - 128) * 8  # the DC coefficient of a flat block at quantizer 1
    cat = max(dc.bit_length(), 1)
    head = SOI + _segment(0xDB, b"\x00" + bytes([1] * 64))  # one table of 1s
    head += _segment(0xC2, struct.pack(">BHHB", 8, height, width, components)
                     + b"".join(bytes([c + 1, 0x11, 0]) for c in range(components)))
    # DC: category 0 -> '0', the first block's category -> '10'; AC: EOB0..EOB14 -> 4-bit codes
    head += _segment(0xC4, b"\x00" + bytes([1, 1] + [0] * 14) + bytes([0, cat]))
    head += _segment(0xC4, b"\x10" + bytes([0, 0, 0, 15] + [0] * 12)
                     + bytes(r << 4 for r in range(15)))
    scans = []
    dc_bits = _Bits()
    for b in range(blocks):  # interleaved: one block of each component per MCU
        for c in range(components):
            if b == 0 and c == 0 and dc:
                dc_bits.put(0b10, 2)
                dc_bits.put(dc if dc > 0 else dc + (1 << cat) - 1, cat)
            else:
                dc_bits.put(0, 1)
    sos = struct.pack(">B", components) + b"".join(bytes([c + 1, 0x00]) for c in range(components))
    scans.append(_segment(0xDA, sos + bytes([0, 0, 0])) + dc_bits.done())
    for c in range(components):
        for k in range(1, 64):
            for ah, low in [(0, al)] + [(a, a - 1) for a in range(al, 0, -1)]:
                bits = _Bits()
                _eob_runs(bits, blocks)
                scans.append(_segment(0xDA, bytes([1, c + 1, 0x00, k, k, ah << 4 | low]))
                             + bits.done())
    return head + b"".join(scans) + EOI


def with_byte_before_first_scan(jpeg: bytes) -> bytes:
    """One stray byte where the first scan's marker belongs: libjpeg-turbo's header reader warns
    (so simplejpeg refuses the file) while Pillow reads on."""
    i = jpeg.find(b"\xff\xda")
    return jpeg[:i] + b"\x00" + jpeg[i:]


def packed(root: Path, data: bytes) -> Path:
    """An LMDB dataset of a good photo and ``data``, written directly (the converter refuses
    hostile ``data``; an older one stored it)."""
    from feedpipe.dataset.manifest import FileEntry, Manifest
    from feedpipe.dataset.registry import WRITERS
    from feedpipe.schema.fields import ImageField, JsonField
    from feedpipe.schema.model import Schema

    schema = Schema((ImageField("image", "jpeg"), JsonField("path")))
    writer = WRITERS["lmdb"](root, schema)
    writer.write({"image": encode(photo(64, 48)), "path": "good.jpg"})
    writer.write({"image": data, "path": "hostile.jpg"})
    files, extra = writer.close()
    Manifest("lmdb", 2, schema, (), tuple(FileEntry.of(root, f) for f in files), {}, (),
             extra).write(root)
    return root
