"""What a conversion made: each image as stored (:class:`Stored`) or why it was refused
(:class:`Refused`), and the run's account (:class:`ConvertResult`), read by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: how a progressive JPEG stored as baseline (converters.progressive) was stored
TRANSCODED = "progressive jpeg→baseline jpeg"


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


@dataclass
class ConvertResult:
    """What a conversion did, for the CLI summary and for callers."""

    out: Path | str  # a str for a URL output
    written: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    passthrough: int = 0
    reencoded: int = 0
    transcoded: int = 0  # progressive JPEGs stored as baseline, losslessly (jpeg="baseline")
    ignored: int = 0
    stored: dict[str, int] = field(default_factory=dict)  # "jpeg unchanged", "tiff→png"... → count
    ignored_files: list[dict[str, str]] = field(default_factory=list)  # {"path", "reason"}
    slow_jpegs: list[str] = field(default_factory=list)  # need the Pillow fallback decoder
    progressive_kept: list[dict[str, str]] = field(default_factory=list)  # not transcoded: why
    lossy: list[dict[str, str]] = field(default_factory=list)  # re-encoded unasked (CMYK, EXIF)
    channels_dropped: list[str] = field(default_factory=list)  # extra_channels="drop" did this
    empty_classes: list[str] = field(default_factory=list)
    image_codec: str = ""
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    splits: dict[str, int] = field(default_factory=dict)
    unmatched_masks: list[str] = field(default_factory=list)
    unlabeled: list[str] = field(default_factory=list)  # labelled manifest rows kept with -1
    mask_palette: tuple[tuple[int, int, int, int], ...] | None = None  # (r, g, b, class)
    palette_left_out: list[dict[str, Any]] = field(default_factory=list)  # auto's rare colours
    missing: dict[str, Any] = field(default_factory=dict)  # arrays: NaN per field (converters.arrays)

    @property
    def rate(self) -> float:
        return (self.written + len(self.skipped)) / self.seconds if self.seconds else 0.0

    def tally(self, stored: Stored, rel: str) -> None:
        """Count how one image was stored, for the summary and the manifest."""
        self.stored[stored.how] = self.stored.get(stored.how, 0) + 1
        unchanged = stored.how.endswith(" unchanged")
        lossless = stored.how == TRANSCODED
        self.passthrough += unchanged
        self.transcoded += lossless
        self.reencoded += not (unchanged or lossless)
        if stored.kept:
            self.progressive_kept.append({"path": rel, "reason": stored.kept})
        if stored.lossy:
            self.lossy.append({"path": rel, "reason": stored.lossy})
        if stored.slow_jpeg:
            self.slow_jpegs.append(rel)
        if stored.dropped:
            self.channels_dropped.append(rel)

    def account(self) -> dict[str, Any]:
        """The manifest's account of how the images were stored and what needs attention."""
        return {"stored": self.stored, "ignored": self.ignored_files,
                "jpegs_needing_fallback_decoder": self.slow_jpegs,
                "channels_dropped": self.channels_dropped, "jpeg_transcoded": self.transcoded,
                "jpeg_progressive_kept": self.progressive_kept, "reencoded_lossy": self.lossy}
