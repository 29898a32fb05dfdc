"""What the converter stored for one input image (:class:`Stored`), or why it refused it
(:class:`Refused`): made by :mod:`converters.images`, rewritten by :mod:`converters.progressive`,
counted by :mod:`converters.report`; its own module so that none of them imports another for it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class Refused(Exception):
    """This input cannot be stored as asked; the message is the skip reason."""


@dataclass(frozen=True)
class Stored:
    """One image as stored: the value, how it was made, and notes for the summary."""

    value: bytes | np.ndarray
    how: str                      # "jpeg unchanged", "tiff→png", "jpeg→jpeg", "png→raw", ...
    codec: str                    # the stored codec: jpeg, png, webp or raw
    size: tuple[int, int]         # the upright source's (W, H), before any resize
    slow_jpeg: bool = False       # simplejpeg cannot read it; the fallback decoder read it whole
    dropped: str | None = None    # what extra_channels="drop" removed
    progressive: bool = False     # a progressive JPEG stored as it is (converters.progressive)
    kept: str | None = None       # why that JPEG was not transcoded to baseline (jpeg="baseline")
    lossy: str | None = None      # why it was lossily re-encoded unasked (EXIF rotation, CMYK)
