"""Moving bytes between a store and local files, every request under the retry policy. Downloads
go in ranged chunks, each appended to a partial file as it arrives, so a cut connection or a
killed process resumes from the bytes on disk."""

from __future__ import annotations

import errno
import functools
import os
import stat
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import ResourceError, StorageError
from .retry import DEFAULT_POLICY, RetryPolicy, with_retries
from .urls import filesystem

FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
CHUNK = 16 << 20  # bytes per ranged request: a cut connection costs at most this much again
Options = Mapping[str, Any] | None


def _call(url: str, what: str, fn: Callable[[Any, str], Any], storage_options: Options,
          policy: RetryPolicy) -> Any:
    """``fn(filesystem, path)`` under ``policy``'s retries."""
    fs, path = filesystem(url, storage_options, policy.timeout)
    return with_retries(lambda: fn(fs, path), url, what, policy)


def read_bytes(url: str, storage_options: Options = None,
               policy: RetryPolicy = DEFAULT_POLICY) -> bytes:
    """The whole object (a manifest, an index file)."""
    return _call(url, "reading", lambda fs, p: bytes(fs.cat_file(p)), storage_options, policy)


def remote_size(url: str, storage_options: Options = None,
                policy: RetryPolicy = DEFAULT_POLICY) -> int:
    """The object's size in bytes."""
    return int(_call(url, "asking its size", lambda fs, p: fs.size(p), storage_options, policy))


def upload(local: str | os.PathLike[str], url: str, storage_options: Options = None,
           policy: RetryPolicy = DEFAULT_POLICY) -> None:
    """Put a local file at ``url`` (one object; a retry sends it again whole)."""
    _call(url, "uploading", lambda fs, p: fs.put_file(os.fspath(local), p), storage_options,
          policy)


def download(url: str, part: Path, size: int, storage_options: Options = None,
             policy: RetryPolicy = DEFAULT_POLICY, chunk: int = CHUNK,
             progress: Callable[[int], None] | None = None) -> None:
    """Append ``url``'s bytes to ``part`` from ``part``'s current length up to ``size``, one
    ranged request per ``chunk``, each flushed before the next; the retry budget counts failures
    in a row, so a slow but moving transfer never exhausts it. The caller verifies and renames."""
    fs, path = filesystem(url, storage_options, policy.timeout)
    from fsspec import AbstractFileSystem  # installed: filesystem() found it

    # an async filesystem's (s3fs, http) sync cat_file is set on the instance, not the class
    ranged = getattr(fs.cat_file, "__func__", None) is not AbstractFileSystem.cat_file

    def get(start: int, end: int) -> bytes:
        if ranged:
            data = bytes(fs.cat_file(path, start=start, end=end))
        else:  # huggingface_hub's: a buffered file's read-ahead would ask for more than the range
            with fs.open(path, "rb", cache_type="none") as fh:
                fh.seek(start)
                data = bytes(fh.read(end - start))
        if len(data) > end - start:  # a 200 with the whole object: no retry can help
            raise StorageError(
                f"{url}: asked bytes {start}-{end - 1}, the server answered with {len(data)} "
                "bytes (it ignored the Range header): Range request not supported. Serve the "
                "dataset from a server that honours HTTP Range requests (or an object store)",
                url=url)
        if len(data) < end - start:  # a short body: the server cut it
            raise ConnectionError(f"asked bytes {start}-{end - 1}, got {len(data)} bytes")
        return data

    try:
        with os.fdopen(open_plain(part, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                  "as the partial download"), "ab") as out:
            done = out.tell()
            if done > size:
                raise StorageError(f"{part}: partial download holds {done} bytes, more than the "
                                   f"{size} of {url}; remove it", url=url)
            for start in range(done, size, chunk):
                end = min(start + chunk, size)
                data = with_retries(functools.partial(get, start, end), url,
                                    f"downloading bytes {start}-{end - 1}", policy)
                out.write(data)
                out.flush()
                if progress is not None:
                    progress(len(data))
            os.fsync(out.fileno())
    except OSError as exc:
        if exc.errno not in FULL:
            raise
        raise ResourceError(f"{part}: its filesystem is full ({exc.strerror}) downloading {url}; "
                            "free space there (the partial file resumes from where it stopped)",
                            file=str(part), errno=exc.errno) from exc


def open_plain(path: Path, flags: int, where: str, write: bool = True) -> int:
    """``os.open`` never through a symlink, only of a regular file (a FIFO would block) and, to
    ``write``, not of a hard link, so a name planted there cannot redirect a read or a write;
    ``where`` says where the file is, in the StorageError."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise StorageError(f"{path}: a symlink {where}; feedpipe never opens one (it could lead "
                           "outside the folder). Remove it.") from exc
    st = os.fstat(fd)
    why = ("is not a regular file" if not stat.S_ISREG(st.st_mode) else
           "is a hard link to another file" if write and st.st_nlink != 1 else None)
    if why is not None:
        os.close(fd)
        raise StorageError(f"{path}: {where}, {why}; feedpipe does not open it. Remove it.")
    os.set_blocking(fd, True)
    return fd
