"""Progressive JPEGs (~3× slower to decode: benchmarks/RESULTS.md) stored as baseline through
libjpeg-turbo's lossless transform: the same DCT coefficients, tables and markers. Each result is
checked; a file that fails, or a platform without turbojpeg, keeps its bytes, named with why."""

from __future__ import annotations

import re
from dataclasses import replace

from feedpipe.errors import BadInputError
from feedpipe.schema.codecs import JPEG_PROGRESSIVE, jpeg_header
from feedpipe.schema.imaging import read_jpeg_whole, simplejpeg, turbojpeg

from .result import TRANSCODED, Refused, Stored


def can_transcode() -> bool:
    """Whether this platform has the lossless transform (and simplejpeg, to check it)."""
    return turbojpeg is not None and simplejpeg is not None


_MARKER = re.compile(rb"\xff(?=[^\x00\xd0-\xd7\xff])")  # in entropy-coded data: stuffing, RSTn, fill


def scans_complete(data: bytes) -> bool:
    """Whether the scans before the first end-of-image marker give every coefficient of every
    component in full. When they do not, libjpeg smooths the missing ones as it decodes (block
    smoothing), and a baseline file holding the same coefficients decodes to other pixels."""
    pos, n, needed = 2, len(data), {}
    while pos + 4 <= n and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF or 0xD0 <= marker <= 0xD7 or marker == 0x01:
            pos += 1 if marker == 0xFF else 2
            continue
        if marker == 0xD9:
            break
        length = data[pos + 2] << 8 | data[pos + 3]
        if marker in JPEG_PROGRESSIVE:  # component ids, every third byte after the count
            needed = {comp: [64] * 64 for comp in data[pos + 10: pos + 2 + length: 3]}
        elif marker == 0xDA and length >= 6 and pos + 2 + length <= n:
            ns = data[pos + 4]
            ss, se, approx = data[pos + 5 + 2 * ns: pos + 8 + 2 * ns].ljust(3, b"\0")
            for bits in (needed[c] for c in data[pos + 5: pos + 5 + 2 * ns: 2] if c in needed):
                bits[ss: se + 1] = [min(b, approx & 0x0F) for b in bits[ss: se + 1]]
            found = _MARKER.search(data, pos + 2 + length)
            if found is None:
                break
            pos = found.start()
            continue
        pos += 2 + length
    return bool(needed) and all(b == 0 for bits in needed.values() for b in bits)


def to_baseline(data: bytes) -> tuple[bytes, None] | tuple[None, str]:
    """``data`` (a progressive JPEG) as baseline, checked: (the bytes, None), or (None, why it is
    kept as it is). BadInputError when the source's data is damaged."""
    if not can_transcode():
        return None, ("not transcoded: the lossless transform needs the turbojpeg package, which "
                      "has no wheel for this platform or Python (pip install turbojpeg)")
    if not scans_complete(data):
        read_jpeg_whole(data, "corrupt image")  # damaged data raises
        return None, ("not transcoded: its scans leave coefficients out, which the decoder "
                      "estimates (a baseline file would decode to other pixels)")
    try:  # reads every scan; libjpeg-turbo's first warning raises
        out = turbojpeg.transform(data, optimize=True)  # progressive=False, copynone=False
    except RuntimeError as exc:
        read_jpeg_whole(data, "corrupt image")  # damaged data raises; else a kind it cannot take
        return None, f"not transcoded: the lossless transform failed ({exc})"
    before, after = jpeg_header(data), jpeg_header(out)
    if after is None or after.marker in JPEG_PROGRESSIVE:
        return None, "not transcoded: the transform did not give a baseline JPEG"
    if before is None or after[:4] != before[:4]:
        return None, "not transcoded: the baseline file declares another size or orientation"
    try:
        read_jpeg_whole(out, "baseline file")
    except BadInputError as exc:
        return None, f"not transcoded: the baseline file does not decode whole ({exc})"
    return out, None


def transcoded(stored: Stored) -> Stored:
    """A progressive JPEG stored as it is → stored as baseline, or kept with the reason in
    ``kept``; Refused when its data is damaged."""
    try:
        out, why = to_baseline(bytes(stored.value))
    except BadInputError as exc:
        raise Refused(str(exc)) from exc
    if out is None:
        return replace(stored, kept=why)
    return replace(stored, value=out, how=TRANSCODED, progressive=False, slow_jpeg=False)
