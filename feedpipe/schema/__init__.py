"""Schema layer: the field model (:mod:`.fields`), the record codecs (:mod:`.codecs`) and image
decoding (:mod:`.imaging`); imports only ``feedpipe.errors``.

The field names are imported on first use (PEP 562), so ``import feedpipe.schema.codecs`` (numpy
only: conversion workers, ``feedpipe info``) does not load Pillow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["IMAGE_CODECS", "ArrayField", "BytesField", "Field", "ImageField", "JsonField",
           "LabelField", "MaskField", "Schema", "TargetField", "field_from_json"]

if TYPE_CHECKING:
    from .fields import (
        IMAGE_CODECS,
        ArrayField,
        BytesField,
        Field,
        ImageField,
        JsonField,
        LabelField,
        MaskField,
        Schema,
        TargetField,
        field_from_json,
    )


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'feedpipe.schema' has no attribute {name!r}")
    value = getattr(importlib.import_module(".fields", __name__), name)
    globals()[name] = value
    return value
