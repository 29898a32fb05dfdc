"""feedpipe: pack image datasets once, then feed PyTorch training at the speed of the hardware.

The public names load on first use (PEP 562): a conversion worker or ``feedpipe info`` never
pays for torch (1-2 s at start-up); ``feedpipe.make_loader`` does. Layers: ARCHITECTURE.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

_EXPORTS = {name: module for module, names in {  # the module (under feedpipe) of each public name
    "errors": "AccessDeniedError BadInputError ConfigError CorruptRecordError DamagedDataError "
              "DamagedImageError DataFileMismatchError DatasetReplacedError FeedpipeError "
              "LoaderError MissingDependencyError NotRegularFileError RemoteNotFoundError "
              "ResourceError SampleError StorageError TransformError UnsafeDataError",
    "dataset.registry": "DatasetReader DatasetWriter open_dataset",
    "dataset.manifest": "Manifest", "dataset.verify": "verify", "loader.api": "make_loader",
    "loader.config": "Dali LoaderConfig Mix Output RandomResizedCrop Remote Sampler Workers World",
    "tools.tuned": "tuned", "loader.protocol": "Loader", "tools.monitor": "StallMeter",
    "schema": "ArrayField BytesField ImageField JsonField LabelField MaskField Schema TargetField",
    "tools.tune": "autotune find_batch_size",
    "converters": "convert",  # a top-level package beside feedpipe: see __getattr__
}.items() for name in names.split()}

__all__ = sorted(_EXPORTS)  # every lazy export is public: one list, not two to keep in step

if TYPE_CHECKING:
    from converters import convert

    from .dataset.manifest import Manifest
    from .dataset.registry import DatasetReader, DatasetWriter, open_dataset
    from .dataset.verify import verify
    from .errors import (
        AccessDeniedError,
        BadInputError,
        ConfigError,
        CorruptRecordError,
        DamagedDataError,
        DamagedImageError,
        DataFileMismatchError,
        DatasetReplacedError,
        FeedpipeError,
        LoaderError,
        MissingDependencyError,
        NotRegularFileError,
        RemoteNotFoundError,
        ResourceError,
        SampleError,
        StorageError,
        TransformError,
        UnsafeDataError,
    )
    from .loader.api import make_loader
    from .loader.config import (
        Dali,
        LoaderConfig,
        Mix,
        Output,
        RandomResizedCrop,
        Remote,
        Sampler,
        Workers,
        World,
    )
    from .loader.protocol import Loader
    from .schema import (
        ArrayField,
        BytesField,
        ImageField,
        JsonField,
        LabelField,
        MaskField,
        Schema,
        TargetField,
    )
    from .tools.monitor import StallMeter
    from .tools.tune import autotune, find_batch_size
    from .tools.tuned import tuned


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'feedpipe' has no attribute {name!r}")
    package = (module, None) if module == "converters" else (f".{module}", __name__)
    value = getattr(importlib.import_module(*package), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
