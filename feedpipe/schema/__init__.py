"""Schema layer: the field model (:mod:`.fields`, :mod:`.masks`, :mod:`.geometric`), the dataset schema
(:mod:`.model`), the record codecs (:mod:`.codecs`) and image decoding (:mod:`.imaging`);
imports only ``feedpipe.errors``.

The names are imported on first use (PEP 562), so ``import feedpipe.schema.codecs`` (numpy only:
conversion workers, ``feedpipe info``) does not load Pillow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "IMAGE_CODECS": "fields", "ArrayField": "fields", "BytesField": "fields", "Field": "fields",
    "ImageField": "fields", "JsonField": "fields", "LabelField": "fields",
    "MaskField": "masks", "TargetField": "masks",
    "BoxesField": "geometric", "KeypointsField": "geometric", "TextField": "geometric",
    "Schema": "model", "field_from_json": "model",
}
__all__ = ["IMAGE_CODECS", "ArrayField", "BoxesField", "BytesField", "Field", "ImageField",
           "JsonField", "KeypointsField", "LabelField", "MaskField", "Schema", "TargetField",
           "TextField", "field_from_json"]

if TYPE_CHECKING:
    from .fields import (
        IMAGE_CODECS,
        ArrayField,
        BytesField,
        Field,
        ImageField,
        JsonField,
        LabelField,
    )
    from .geometric import BoxesField, KeypointsField, TextField
    from .masks import MaskField, TargetField
    from .model import Schema, field_from_json


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'feedpipe.schema' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
