"""feedpipe's per-user cache directory, its one atomic file write, and reading a file only when
it is a regular file."""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import NotRegularFileError

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_MANGLED = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")  # Path("s3://b/k") is "s3:/b/k"
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFDIR: "a folder", stat.S_IFSOCK: "a socket",
         stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


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


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """A new file to fill in place of ``path``: made by ``mkstemp`` beside it (``O_EXCL``, a
    random name: never opened through a symlink planted in the folder), flushed to disk and
    renamed over ``path`` when the block ends, removed when it raises, so that a reader, or a
    crash, sees the old file or the whole new one. A full disk's error names ``path``."""
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


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of ``path`` when it is a regular file (symlinks followed). It is
    opened non-blocking (opening a FIFO waits for a writer, forever) and checked with ``fstat``:
    a FIFO, a device (``/dev/zero`` never ends), a socket or a folder is closed again and refused
    with :class:`NotRegularFileError` before a byte is read."""
    return _open_regular(path)[0]


def _open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not stat.S_ISREG(mode):
            kind = KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise NotRegularFileError(f"{os.fspath(path)}: {kind}, not a regular file; refused "
                                      "unread (reading it could block forever or never end)",
                                      kind=kind, file=os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """A whole regular file (:func:`open_regular`'s check) in four system calls
    (``Path.read_bytes`` takes eight: buffered open's isatty and seeks, and a second read to see
    the end; ~10 µs an image in a passthrough conversion)."""
    fd, st = _open_regular(path)
    try:
        size = st.st_size
        data = os.read(fd, size + 1)
        if len(data) <= size:  # a short read: the end of a regular file
            return data
        chunks = [data]  # it grew meanwhile, or reports no size (/proc)
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
