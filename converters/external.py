"""Which in-memory record source ``feedpipe convert SRC`` names, if any: foreign WebDataset
shards (:mod:`converters.foreign_wds`) or a Hugging Face dataset (:mod:`converters.hf`)."""

from __future__ import annotations

from pathlib import Path

from .records import RecordSource


def record_source(src: str | Path, split: str = "train", max_member_bytes: int | None = None
                  ) -> RecordSource | None:
    """The record source for ``src``, or None for the file sources :func:`converters.convert`
    scans (folders of images, manifests); ``max_member_bytes``: foreign shards' member limit
    (default :data:`converters.foreign_wds.MAX_MEMBER_BYTES`)."""
    from . import foreign_wds, hf

    s = str(src)
    if s.startswith("hf://") or hf.is_saved_dataset(Path(s)):
        return hf.source(s, split)
    if foreign_wds.looks_like_shards(s):
        return foreign_wds.source([s], max_member_bytes or foreign_wds.MAX_MEMBER_BYTES)
    return None
