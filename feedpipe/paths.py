"""feedpipe's per-user cache directory and its one atomic file write."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_MANGLED = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")  # Path("s3://b/k") is "s3:/b/k"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/feedpipe`` (default ``~/.cache/feedpipe``): tuning results, DALI indexes."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "feedpipe"


def url_scheme(location: str | os.PathLike[str]) -> str | None:
    """The scheme of a URL-looking location (``s3`` for ``s3://bucket/ds``), else None.

    A URL that went through ``pathlib.Path`` (``s3:/bucket/ds``: one slash dropped) counts too,
    so a remote location is never taken for a local folder named ``s3:``.
    """
    m = _URL.match(os.fspath(location)) or _MANGLED.match(os.fspath(location))
    return m[1].lower() if m else None


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (str as UTF-8) so that a reader, or a crash, sees the old file or the whole
    new one: a temporary file in the same folder, flushed to disk, then renamed over ``path``."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; reports, caches and indexes are shared
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
