"""Schema layer: the field model, the record codecs and image decoding; imports only errors."""

from .fields import (IMAGE_CODECS, ArrayField, BytesField, Field, ImageField, JsonField, LabelField,
                     MaskField, Schema, TargetField, field_from_json)

__all__ = ["IMAGE_CODECS", "ArrayField", "BytesField", "Field", "ImageField", "JsonField",
           "LabelField", "MaskField", "Schema", "TargetField", "field_from_json"]
