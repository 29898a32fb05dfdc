"""A warning for the ``meta`` JSON passthrough: its values (manifest columns nobody declared) are
served unchanged, in stored-image pixels, so any coordinates in it no longer match an image the
loader crops, resizes or flips. Typed fields (keypoints, boxes) follow the image instead."""

from __future__ import annotations

import warnings
from typing import Sequence

from ..schema.fields import ImageField, JsonField
from ..schema.model import Schema
from .config import LoaderConfig

META = "meta"


def moves_pixels(cfg: LoaderConfig, images: Sequence[ImageField]) -> bool:
    """Whether the transforms move the pixels of ``images`` (the requested ones): a flip, or a
    crop/resize to ``size``; ``crop="none"``, and a resize of fixed-shape raw images to their
    own size, move nothing."""
    if not images:
        return False
    if cfg.flip:
        return True
    if cfg.size is None or cfg.crop == "none":
        return False
    return not (cfg.crop == "resize" and
                {f.shape[:2] if f.shape else None for f in images} == {tuple(cfg.size)})


def warn_meta(root: object, cfg: LoaderConfig, schema: Schema, fields: Sequence[str],
              images: Sequence[ImageField]) -> None:
    """Warn when ``meta`` is requested next to images the transforms move (once per dataset and
    calling line, under Python's default warning filter)."""
    if META in fields and META in schema and isinstance(schema[META], JsonField) \
            and moves_pixels(cfg, images):
        warnings.warn(f"{root}: the 'meta' field is passed through unchanged, in stored-image "
                      "pixels, but this loader crops, resizes or flips the image, so coordinates "
                      "in meta no longer match it. Store them as typed fields instead "
                      "(--keypoints-column, --boxes-column; see docs/fields.md), which follow "
                      "the image", UserWarning, stacklevel=4)
