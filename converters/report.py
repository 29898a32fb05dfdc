"""The converter's account of a run: how each input was stored, and what needs a user's attention
(files not taken, JPEGs only the fallback decoder reads, channels dropped, classes left empty)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from feedpipe.errors import BadInputError
from feedpipe.schema.model import Schema

from .images import Stored
from .progressive import TRANSCODED
from .sources import Source, SourceItem

if TYPE_CHECKING:
    from .result import ConvertResult

log = logging.getLogger("feedpipe.convert")


def tally(result: ConvertResult, stored: Stored, rel: str) -> None:
    """Count how one image was stored, for the summary and the manifest."""
    result.stored[stored.how] = result.stored.get(stored.how, 0) + 1
    unchanged = stored.how.endswith(" unchanged")
    lossless = stored.how == TRANSCODED
    result.passthrough += unchanged
    result.transcoded += lossless
    result.reencoded += not (unchanged or lossless)
    if stored.kept:
        result.progressive_kept.append({"path": rel, "reason": stored.kept})
    if stored.lossy:
        result.lossy.append({"path": rel, "reason": stored.lossy})
    if stored.slow_jpeg:
        result.slow_jpegs.append(rel)
    if stored.dropped:
        result.channels_dropped.append(rel)


def account(source: Source, result: ConvertResult, items: list[SourceItem],
            skipped: dict[str, list[dict[str, str]]], strict: bool,
            whole: bool = True) -> dict[str, Any]:
    """The manifest's account of what was stored and what was not; classes left with no samples
    are a warning (an error under ``strict``), unless ``items`` are one part of the source
    (``whole=False``: the merge checks the classes across parts)."""
    gone = {s["path"] for v in skipped.values() for s in v}
    have = {it.label for it in items if it.rel not in gone}
    result.empty_classes = [c for k, c in enumerate(source.classes) if k not in have] \
        if source.labeled else []  # COCO's classes name box categories, not sample labels
    result.unlabeled = [it.rel for it in items if it.label < 0 and it.rel not in gone] \
        if source.labeled else []  # rows a labelled manifest keeps with -1 (unlabeled="keep")
    if result.empty_classes and whole:
        msg = (f"{source.root}: class(es) with no samples: {', '.join(result.empty_classes)} "
               "(their files were skipped or not images; see the manifest)")
        if strict:
            raise BadInputError(msg)
        log.warning(msg)
    return {"stored": result.stored, "ignored": result.ignored_files,
            "empty_classes": result.empty_classes, "unlabeled": result.unlabeled,
            "jpegs_needing_fallback_decoder": result.slow_jpegs,
            "channels_dropped": result.channels_dropped, **jpeg_account(result)}


def jpeg_account(result: ConvertResult) -> dict[str, Any]:
    """The manifest's count of progressive JPEGs stored as baseline, those kept as they are, and
    the images lossily re-encoded unasked (EXIF rotation, CMYK), each with the reason."""
    return {"jpeg_transcoded": result.transcoded, "jpeg_progressive_kept": result.progressive_kept,
            "reencoded_lossy": result.lossy}


def settle_codec(schema: Schema, result: ConvertResult) -> Schema:
    """Narrow a provisional "mixed" image codec to the one codec every written record has."""
    image = schema["image"]
    if getattr(image, "codec", None) != "mixed":
        return schema
    codecs = {how.split()[0] if how.endswith(" unchanged") else how.split("→")[1].split()[-1]
              for how in result.stored}
    if len(codecs) > 1:
        return schema
    result.image_codec = codecs.pop() if codecs else "jpeg"
    return Schema(tuple(replace(f, codec=result.image_codec) if f is image else f for f in schema))
