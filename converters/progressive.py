"""Progressive JPEGs stored as baseline, losslessly (``jpeg="baseline"``, the default).

A progressive JPEG decodes ~3× slower than a baseline one with the same pixels, and the DCT-scaled
decode hardly helps it (8.5 ms against 2.9 ms for a median web photo, benchmarks/RESULTS.md).
libjpeg-turbo's lossless transform (``jpegtran -copy all -optimize``: ``tj3Transform`` with no
operation, ``TJXOPT_OPTIMIZE``, ``TJXOPT_PROGRESSIVE`` unset) rewrites the entropy coding only: the same DCT
coefficients, quantization tables and markers (EXIF, ICC, comments), so the decoded pixels are
the source's. Each result is checked anyway: both files are decoded with simplejpeg (the loader's
decoder) and compared exactly; a file that cannot be transcoded, or whose check fails, is stored
as it is and named with the reason.

The transform comes from the ``turbojpeg`` package (pybind11 bindings over the TurboJPEG 3 API;
its wheels bundle libturbojpeg, so nothing comes from the system). Where it has no wheel (Linux
other than x86_64, Python 3.14+) it is not installed, and progressive JPEGs are kept as they are
and named with that reason.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from feedpipe.schema.codecs import JPEG_PROGRESSIVE, jpeg_frame

try:
    import simplejpeg
except ImportError:  # pragma: no cover - a dependency; the check below then names it
    simplejpeg = None
try:
    import turbojpeg
except ImportError:  # pragma: no cover - no wheel for this platform / Python (see pyproject)
    turbojpeg = None

from .stored import Stored

#: how a transcoded image was stored, in ``ConvertResult.stored`` and the manifest
TRANSCODED = "progressive jpeg→baseline jpeg"
NO_TRANSFORM = ("not transcoded: the lossless transform needs the turbojpeg package, which has "
                "no wheel for this platform or Python (pip install turbojpeg)")


def to_baseline(data: bytes) -> tuple[bytes, None] | tuple[None, str]:
    """``data`` (a progressive JPEG) as baseline with the same coefficients and markers, checked
    pixel for pixel: (the baseline bytes, None), or (None, why it is kept as it is)."""
    if turbojpeg is None or simplejpeg is None:
        return None, NO_TRANSFORM
    try:  # decoded first: a file libjpeg-turbo warns about never reaches the transform
        before = simplejpeg.decode_jpeg(data, colorspace="RGB")
    except ValueError as exc:
        return None, f"not transcoded: simplejpeg cannot decode it to check a transcode ({exc})"
    try:
        out = turbojpeg.transform(data, optimize=True)  # progressive=False, copynone=False
    except RuntimeError as exc:
        return None, f"not transcoded: the lossless transform failed ({exc})"
    frame = jpeg_frame(out)
    if frame is None or frame[4] in JPEG_PROGRESSIVE:
        return None, "not transcoded: the transform did not give a baseline JPEG"
    try:
        after = simplejpeg.decode_jpeg(out, colorspace="RGB")
    except ValueError as exc:
        return None, f"not transcoded: the baseline file does not decode ({exc})"
    if not np.array_equal(before, after):
        return None, "not transcoded: the baseline file decodes to different pixels"
    return out, None


def transcoded(stored: Stored) -> Stored:
    """A progressive JPEG stored as it is (``stored.progressive``) → stored as baseline, or kept
    with the reason in ``kept``. Runs in the conversion's worker processes."""
    out, why = to_baseline(bytes(stored.value))
    if out is None:
        return replace(stored, kept=why)
    return replace(stored, value=out, how=TRANSCODED, progressive=False, slow_jpeg=False)
