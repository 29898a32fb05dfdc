"""feedpipe: pack image datasets once, then feed PyTorch training at the speed of the hardware."""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (BadInputError, ConfigError, CorruptRecordError, FeedpipeError,
                     IncompleteDatasetError, ManifestError, UnsafeDataError)
from .formats import DatasetReader, open_dataset
from .loader import LoaderConfig, make_loader
from .manifest import Manifest
from .schema import ArrayField, BytesField, ImageField, JsonField, LabelField, Schema

__all__ = [
    "ArrayField", "BadInputError", "BytesField", "ConfigError", "CorruptRecordError",
    "DatasetReader", "FeedpipeError", "ImageField", "IncompleteDatasetError", "JsonField",
    "LabelField", "LoaderConfig", "Manifest", "ManifestError", "Schema", "UnsafeDataError", "make_loader", "open_dataset",
]
