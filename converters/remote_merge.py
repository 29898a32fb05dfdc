"""A part is never converted into an object-store prefix that is already a merged dataset.

``feedpipe merge s3://bucket/ds`` itself runs :func:`converters.merge.merge`, whose file steps go
through the output's :class:`feedpipe.storage.Store`: on an object store it reads the parts'
manifests and index files under ``URL/parts/``, uploads the merged index files, then the merged
manifest last (the commit point). An interrupted merge leaves no top-level manifest, so nothing
reads the prefix as a dataset, and running it again finishes it.
"""

from __future__ import annotations

from typing import Any, Mapping

from feedpipe.dataset.manifest import MANIFEST_NAME
from feedpipe.errors import ConfigError
from feedpipe.storage.store import open_store


def refuse_merged(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """A part is never converted into a prefix that is already a merged dataset (its manifest
    lists the parts' objects: replacing one would break it)."""
    try:
        open_store(url, storage_options).size(MANIFEST_NAME)
    except FileNotFoundError:
        return
    raise ConfigError(f"{url} is already a merged dataset; convert parts into a new output")
