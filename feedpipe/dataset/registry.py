"""Format registry: the manifest's ``format`` key picks the reader; writers by name."""

from __future__ import annotations

import os
from typing import Any, Mapping

from ..errors import DatasetReplacedError
from ..storage import is_remote, local_path
from .formats.base import DatasetReader, DatasetWriter, root_identity, sample_key
from .formats.hdf5 import Hdf5Reader, Hdf5Writer
from .formats.lmdb import LmdbReader, LmdbWriter
from .formats.wds import WdsReader, WdsWriter
from .manifest import Manifest
from .remote import open_remote

READERS: dict[str, type[DatasetReader]] = {"lmdb": LmdbReader, "hdf5": Hdf5Reader, "wds": WdsReader}
WRITERS: dict[str, type[DatasetWriter]] = {"lmdb": LmdbWriter, "hdf5": Hdf5Writer, "wds": WdsWriter}


def open_dataset(path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None,
                 cache_limit: str | int | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 timeout: float | None = None, **options: Any) -> DatasetReader:
    """Open a packed dataset directory, or a dataset URL (s3://, gs://, https://, hf://,
    file://); the format comes from its manifest (BadInputError without a complete one).

    ``options`` go to the format's reader (``readahead=False`` for LMDB, ``max_open_shards=64``
    for WebDataset). A URL is read through the node-local cache ``cache_dir`` bounded by
    ``cache_limit`` (bytes or "200GB"), ``storage_options`` going to its fsspec filesystem; each
    request waits ``timeout`` seconds (default 30) for its next bytes, and four times that in all.
    """
    if is_remote(path):
        return open_remote(str(path), cache_dir=cache_dir, cache_limit=cache_limit,
                           storage_options=storage_options, timeout=timeout, **options)
    path = local_path(path)
    for _ in range(3):  # a re-conversion may swap the directory between these steps
        before = root_identity(path)
        manifest = Manifest.read(path)
        try:
            reader = READERS[manifest.format](path, manifest, **options)
        except DatasetReplacedError:
            continue
        if reader._root_id == before:
            return reader
        reader.close()
    raise DatasetReplacedError(f"{path}: replaced by a re-conversion each time it was opened; "
                               "open it again when the conversion has finished")


__all__ = ["DatasetReader", "DatasetWriter", "READERS", "WRITERS", "open_dataset", "sample_key"]
