"""feedpipe's per-user cache directory and its one atomic file write."""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_MANGLED = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")  # Path("s3://b/k") is "s3:/b/k"
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: what a file that is not a regular file is, by ``stat.S_IFMT`` of its mode (for messages)
KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFDIR: "a folder", stat.S_IFSOCK: "a socket",
         stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/feedpipe`` (default ``~/.cache/feedpipe``): tuning results, DALI indexes."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "feedpipe"


def url_scheme(location: str | os.PathLike[str]) -> str | None:
    """The scheme of a URL-looking location (``s3`` for ``s3://bucket/ds``), else None; also
    of one that went through ``pathlib.Path`` (``s3:/bucket/ds``), never a local folder."""
    m = _URL.match(os.fspath(location)) or _MANGLED.match(os.fspath(location))
    return m[1].lower() if m else None


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """A new file to fill in place of ``path``: made by ``mkstemp`` beside it (never through a
    planted symlink), synced and renamed over ``path`` at the end, removed if the block raises:
    a reader, or a crash, sees the old file or the whole new one. A full disk names ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w+b") as fh:
            yield fh
            fh.flush()
            os.fchmod(fh.fileno(), 0o644)  # mkstemp's is private; reports, indexes are shared
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno in _FULL and exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (str as UTF-8) atomically (:func:`atomic_writer`)."""
    with atomic_writer(path) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else bytes(data))

