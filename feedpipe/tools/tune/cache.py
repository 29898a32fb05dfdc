"""The autotune cache: one JSON file per (dataset, machine, settings) in feedpipe's cache dir.

A result is reused only when everything it depends on matches (stored with it and compared on
read); files are written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch

from ..._version import __version__
from ...dataset.manifest import MANIFEST_NAME
from ...dataset.registry import DatasetReader
from ...paths import cache_dir, write_atomic
from ...system import usable_cores
from ..machine import cpu_model

log = logging.getLogger("feedpipe.tune")


def cache_key(reader: DatasetReader, batch_size: int, settings: dict[str, Any]) -> dict[str, Any]:
    """What a cached result depends on: the dataset (path, manifest hash and mtime), the machine
    (CPU model, usable cores, feedpipe and torch versions) and every tuning setting."""
    manifest = reader.root / MANIFEST_NAME
    return json.loads(json.dumps({
        "dataset": str(reader.root.resolve()),
        "manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest(),
        "manifest_mtime_ns": manifest.stat().st_mtime_ns,
        "machine": {"cpu": cpu_model(), "usable_cores": usable_cores(),
                    "feedpipe": __version__, "torch": torch.__version__},
        "batch_size": batch_size, "settings": settings,
    }, sort_keys=True, default=str))


def cache_file(key: dict[str, Any]) -> Path:
    """Where the result for ``key`` lives: named by a hash of the key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"tune-{digest}.json"


def read_cache(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The result stored at ``path`` for exactly ``key``, else None (a bad file is logged)."""
    try:
        data = json.loads(path.read_text())
        return data["result"] if data.get("key") == key else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("autotune: ignoring unreadable cache file %s (%s); tuning again", path, exc)
        return None


def write_cache(path: Path, key: dict[str, Any], result: dict[str, Any]) -> None:
    """Write atomically (:func:`write_atomic`); a cache that cannot be written is logged, not
    raised: the next run simply tunes again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"key": key, "result": result}, indent=1))
    except OSError as exc:
        log.warning("autotune: could not write the cache %s (%s); the next run tunes again",
                    path, exc)
