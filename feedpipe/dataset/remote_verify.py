"""``feedpipe info`` and ``feedpipe verify`` on a URL: the names the CLI and callers use.
:mod:`feedpipe.dataset.verify` serves a folder and a URL with one implementation (through a
:class:`~feedpipe.storage.Store`); a URL's objects are fetched, sized and hashed, then re-read."""

from __future__ import annotations

from .verify import read_manifest
from .verify import verify as verify_remote

__all__ = ["read_manifest", "verify_remote"]
