"""feedpipe's per-user cache directory and its one atomic file write."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/feedpipe`` (default ``~/.cache/feedpipe``): tuning results, DALI indexes."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "feedpipe"


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
