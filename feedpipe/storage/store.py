"""Where a dataset's files live, behind one interface (:data:`Store`): a local directory or an
object-store prefix (an fsspec URL), so merge, verify, doctor and outputs have one implementation
for both. Names are relative ``/``-separated paths; writes are atomic either way (a local file
renamed over its name, an object uploaded whole); a missing name is ``FileNotFoundError``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping

from ..paths import atomic_writer
from .retry import with_retries
from .transfer import download, read_bytes, remote_size, upload
from .urls import filesystem, is_remote, join

Writer = Callable[[BinaryIO], None]


def file_digest(path: str | os.PathLike[str], flags: int = 0) -> tuple[int, str]:
    """(size, SHA-256) of a local file (``flags``: added to ``os.open``'s)."""
    h, size = hashlib.sha256(), 0
    with open(os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags), "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


class DirStore:
    """A local directory (its files are read in place, never copied)."""

    remote = False  # True: an object store (no renames, no partial files, every read a fetch)

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.url = str(self.root)  # as messages show it

    def where(self, name: str) -> str:
        """The path or URL of ``name``, for messages and for opening it elsewhere."""
        return str(self.root / name)

    def names(self) -> set[str]:
        """Every file under the store (relative names), hidden ones included."""
        out = set()
        for top, _dirs, files in os.walk(self.root):
            rel = os.path.relpath(top, self.root)
            out |= {f if rel == "." else f"{rel}/{f}" for f in files}
        return out

    def size(self, name: str) -> int:
        st = (self.root / name).stat()
        if not stat.S_ISREG(st.st_mode):  # a folder, FIFO or device is no dataset file
            raise FileNotFoundError(f"{self.root / name}: not a regular file")
        return st.st_size

    def read_bytes(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def local(self, name: str, into: Path, size: int | None = None) -> Path:
        """A local file holding ``name``'s first ``size`` bytes (default: all): a directory's
        own file, or the object downloaded to ``into / name``."""
        if not (self.root / name).is_file():
            raise FileNotFoundError(f"{self.root / name}: missing")
        return self.root / name

    def write(self, name: str, write_fn: Writer) -> tuple[int, str]:
        """Write ``name`` atomically from ``write_fn(file)``; its (size, SHA-256)."""
        with atomic_writer(self.root / name) as fh:
            write_fn(fh)
        return file_digest(self.root / name)

    def put(self, name: str, staged: Path) -> None:
        """Publish a finished local file as ``name``, atomically: renamed in (same filesystem),
        or uploaded (the staged file stays for the caller to remove)."""
        (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, self.root / name)

    def remove(self, names: Iterable[str]) -> None:
        """Delete these names; a missing one is not an error."""
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (self.root / name).unlink()


class UrlStore:
    """An object-store prefix (s3://, gs://, https://, hf://, memory://) through fsspec, with
    feedpipe's retries; a write fills a private temporary file, then uploads it once."""

    remote = True

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.options = dict(storage_options or {})
        self.fs, root = filesystem(self.url, self.options)
        self.root = root.rstrip("/")

    def where(self, name: str) -> str:
        return join(self.url, name)

    def names(self) -> set[str]:
        self.fs.invalidate_cache()
        try:
            found = with_retries(lambda: self.fs.find(self.root), self.url, "listing")
        except FileNotFoundError:
            return set()
        return {p[len(self.root) + 1:] for p in found}

    def size(self, name: str) -> int:
        return remote_size(self.where(name), self.options)

    def read_bytes(self, name: str) -> bytes:
        return read_bytes(self.where(name), self.options)

    def local(self, name: str, into: Path, size: int | None = None) -> Path:
        dest = into / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        download(self.where(name), dest, self.size(name) if size is None else size,
                 self.options)
        return dest

    def write(self, name: str, write_fn: Writer) -> tuple[int, str]:
        with tempfile.TemporaryDirectory(prefix="feedpipe-put-") as tmp:
            with open(Path(tmp) / "file", "xb") as fh:  # a private folder, a new file
                write_fn(fh)
            upload(Path(tmp) / "file", self.where(name), self.options)
            return file_digest(Path(tmp) / "file")

    def put(self, name: str, staged: Path) -> None:
        upload(staged, self.where(name), self.options)

    def remove(self, names: Iterable[str]) -> None:
        keys = [f"{self.root}/{n}" for n in names]

        def rm() -> None:
            try:
                self.fs.rm(keys)  # one batched delete where the store has one (S3)
            except FileNotFoundError:  # a store that refuses a missing key: one by one
                for key in keys:
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm_file(key)

        if keys:
            with_retries(rm, self.url, "deleting")

    def bucket_exists(self) -> bool:
        """Whether the prefix's bucket (its first path part) exists, so that writing into a
        missing one is refused saying so, not as an upload's 404."""
        bucket = self.root.split("/")[0]
        return bool(with_retries(lambda: self.fs.exists(bucket), self.url, "finding the bucket"))


#: a dataset's home: list, read, fetch and atomically write files by relative name
Store = DirStore | UrlStore


def open_store(target: str | os.PathLike[str],
               storage_options: Mapping[str, Any] | None = None) -> Store:
    """The store of a local directory or a URL."""
    if is_remote(target):
        return UrlStore(os.fspath(target), storage_options)
    return DirStore(target)


__all__ = ["DirStore", "Store", "UrlStore", "file_digest", "is_remote", "open_store"]
