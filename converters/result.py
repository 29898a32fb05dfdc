"""What a conversion did (:class:`ConvertResult`): filled by :mod:`converters.packer` and
:mod:`converters.report`, read by the CLI; its own module so that neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
