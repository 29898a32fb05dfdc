"""Progressive JPEGs stored as baseline, losslessly (``jpeg="baseline"``, the default): they decode
~3× slower than baseline with the same pixels (benchmarks/RESULTS.md). libjpeg-turbo's lossless
transform (``turbojpeg``) rewrites the entropy coding only: the same DCT coefficients, tables and
markers. Each result is checked (the source read whole, the baseline file read whole and
declaring the source's size and orientation); a file that fails, or a platform without the
turbojpeg wheel, keeps its bytes and is named with the reason."""

from __future__ import annotations

from dataclasses import replace

from feedpipe.errors import BadInputError
from feedpipe.schema.codecs import JPEG_PROGRESSIVE, jpeg_header
from feedpipe.schema.imaging import read_jpeg_whole, simplejpeg, turbojpeg

from .result import TRANSCODED, Refused, Stored


def can_transcode() -> bool:
    """Whether this platform has the lossless transform (and simplejpeg, to check it)."""
    return turbojpeg is not None and simplejpeg is not None


def to_baseline(data: bytes) -> tuple[bytes, None] | tuple[None, str]:
    """``data`` (a progressive JPEG) as baseline, checked: (the bytes, None), or (None, why it is
    kept as it is). BadInputError when the source's data is damaged."""
    if not can_transcode():
        return None, ("not transcoded: the lossless transform needs the turbojpeg package, which "
                      "has no wheel for this platform or Python (pip install turbojpeg)")
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
    ``kept``; Refused when its data is damaged. Runs in the conversion's worker processes."""
    try:
        out, why = to_baseline(bytes(stored.value))
    except BadInputError as exc:
        raise Refused(str(exc)) from exc
    if out is None:
        return replace(stored, kept=why)
    return replace(stored, value=out, how=TRANSCODED, progressive=False, slow_jpeg=False)
