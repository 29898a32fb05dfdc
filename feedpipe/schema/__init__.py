"""Schema layer: the field model (:mod:`.fields`, :mod:`.masks`, :mod:`.geometric`), the dataset
schema (:mod:`.model`), the record codecs (:mod:`.codecs`) and image decoding (:mod:`.imaging`);
imports only ``feedpipe.errors``. Only :mod:`.imaging` loads Pillow (the fields import it when they
first decode or encode an image), so conversion workers and ``feedpipe info`` start without it."""

from .fields import IMAGE_CODECS, ArrayField, BytesField, Field, ImageField, JsonField, LabelField
from .geometric import BoxesField, KeypointsField, TextField
from .masks import MaskField, TargetField
from .model import Schema, field_from_json

__all__ = ["IMAGE_CODECS", "ArrayField", "BoxesField", "BytesField", "Field", "ImageField",
           "JsonField", "KeypointsField", "LabelField", "MaskField", "Schema", "TargetField",
           "TextField", "field_from_json"]
