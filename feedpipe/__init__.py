"""feedpipe: pack image datasets once, then feed PyTorch training at the speed of the hardware.

The public names are imported on first use (PEP 562): ``import feedpipe.codecs`` or the
``feedpipe convert`` command never pay for torch (1-2 s at start-up); ``feedpipe.make_loader``
does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "BadInputError": "errors", "ConfigError": "errors", "CorruptRecordError": "errors",
    "FeedpipeError": "errors", "IncompleteDatasetError": "errors", "ManifestError": "errors",
    "UnsafeDataError": "errors", "DatasetReader": "formats", "open_dataset": "formats",
    "LoaderConfig": "loader", "make_loader": "loader", "Manifest": "manifest",
    "ArrayField": "schema", "BytesField": "schema", "ImageField": "schema", "JsonField": "schema",
    "LabelField": "schema", "Schema": "schema",
}

__all__ = [
    "ArrayField", "BadInputError", "BytesField", "ConfigError", "CorruptRecordError",
    "DatasetReader", "FeedpipeError", "ImageField", "IncompleteDatasetError", "JsonField",
    "LabelField", "LoaderConfig", "Manifest", "ManifestError", "Schema", "UnsafeDataError",
    "make_loader", "open_dataset",
]

if TYPE_CHECKING:
    from .errors import (BadInputError, ConfigError, CorruptRecordError, FeedpipeError,
                         IncompleteDatasetError, ManifestError, UnsafeDataError)
    from .formats import DatasetReader, open_dataset
    from .loader import LoaderConfig, make_loader
    from .manifest import Manifest
    from .schema import ArrayField, BytesField, ImageField, JsonField, LabelField, Schema


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'feedpipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
