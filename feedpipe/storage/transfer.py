"""Moving bytes between a store and local files, every request under the retry policy.

Downloads go in ranged chunks (fsspec's ``cat_file(start, end)``), each appended to a partial
file as it arrives, so a cut connection or a killed process resumes from the bytes on disk.
"""

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


def _ranged_get(url: str, storage_options: Options,
                timeout: float | None = None) -> Callable[[int, int], bytes]:
    """``get(start, end)``: one request for exactly those bytes. A filesystem without its own
    ranged ``cat_file`` (huggingface_hub's) would read through a buffered file whose read-ahead
    asks for a block more than the range: its file is opened without that cache."""
    fs, path = filesystem(url, storage_options, timeout)
    from fsspec import AbstractFileSystem  # installed: filesystem() found it

    # an async filesystem's (s3fs, http) sync cat_file is set on the instance, not the class
    if getattr(fs.cat_file, "__func__", None) is not AbstractFileSystem.cat_file:
        return lambda start, end: bytes(fs.cat_file(path, start=start, end=end))

    def get(start: int, end: int) -> bytes:
        with fs.open(path, "rb", cache_type="none") as fh:
            fh.seek(start)
            return bytes(fh.read(end - start))

    return get


def download(url: str, part: Path, size: int, storage_options: Options = None,
             policy: RetryPolicy = DEFAULT_POLICY, chunk: int = CHUNK,
             progress: Callable[[int], None] | None = None) -> None:
    """Append ``url``'s bytes to ``part`` from ``part``'s current length up to ``size``, one
    ranged request per ``chunk``, each flushed before the next; the retry budget counts failures
    in a row, so a slow but moving transfer never exhausts it. The caller verifies and renames."""
    ranged_get = _ranged_get(url, storage_options, policy.timeout)

    def get(start: int, end: int) -> bytes:
        data = ranged_get(start, end)
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
        with os.fdopen(_open_part(part), "ab") as out:
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


def _open_part(part: Path) -> int:
    """The partial file, appended to: never through a symlink, only a plain file (not a FIFO,
    not a hard link to another file), so a name planted beside it cannot redirect the write."""
    try:
        fd = os.open(part, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise StorageError(f"{part}: the partial download is a symlink; feedpipe never writes "
                           "through one (it could lead outside the folder): remove it") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise StorageError(f"{part}: the partial download is not a plain file (a FIFO, a device "
                           "or a hard link to another file); remove it")
    os.set_blocking(fd, True)
    return fd
