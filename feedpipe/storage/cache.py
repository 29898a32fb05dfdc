"""The node-local cache of remote dataset files: bounded in bytes, shared by every process on
the node, one download per file per node, and nothing partial ever read as whole.

Layout: ``<cache_dir>/<name>-<key>/`` per dataset, ``key`` a hash of the URL and the manifest's
bytes (a re-converted dataset never mixes with a stale copy). In it: the manifest and index
files (kept, not counted), the data files (counted against ``limit``, evicted least recently
used first), and per data file ``.NAME.lock`` (the download lock; while held it holds the size
reserved for the download) and ``.NAME.part`` (the bytes so far).

Protocol (POSIX ``flock``, released by the kernel when a process dies; without it, on Windows,
a :class:`~feedpipe.errors.StorageError` says so): a reader holds a shared
lock on a data file, so it is never evicted while open; a downloader takes the file's download
lock, reserves room under the cache-wide ``.lock`` (evicting unlocked files), appends to the
part file (resuming a killed download), fsyncs, checks the SHA-256 and renames it into place.
Every file is opened through :mod:`feedpipe.storage.cachefs` (no symlinks, no files of
untrusted users). A full disk is a :class:`~feedpipe.errors.StorageError` naming the file and
its URL, its partial download removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..errors import CorruptRecordError, StorageError
from .cachefs import Trust, trust_of
from .retry import DEFAULT_POLICY, RetryPolicy
from .sizes import parse_size
from .store import file_digest
from .transfer import CHUNK, FULL, download

try:
    import fcntl  # shared and exclusive locks on open files (flock): POSIX
except ImportError:  # Windows: Cache() refuses, naming it
    fcntl = None  # type: ignore[assignment]

KEPT = re.compile(r"^(feedpipe\.json|index-.*)$")  # the manifest and index files: never evicted


def parse_limit(value: str | int | None) -> int | None:
    """``cache_limit``'s bytes (:func:`~feedpipe.storage.sizes.parse_size`); None: no limit."""
    return None if value is None else parse_size(value, "cache_limit")


def default_cache_dir() -> Path:
    """``$FEEDPIPE_CACHE``, else ``~/.cache/feedpipe/remote`` (``$XDG_CACHE_HOME`` honoured)."""
    env = os.environ.get("FEEDPIPE_CACHE")
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "feedpipe"
    return Path(env) if env else base / "remote"


@contextlib.contextmanager
def _flocked(path: Path, trust: Trust, shared: bool = False) -> Iterator[int]:
    fd = trust.open(path, os.O_RDONLY | os.O_CREAT)  # flock needs no write access
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _unheld(path: Path) -> Iterator[tuple[bool | None, int]]:
    """(True, fd) while this process holds ``path`` exclusively, (False, fd) when another
    process holds a lock on it (a download, or a reader's shared lock), (None, -1) when it does
    not exist or is not a regular file (never opened through a link, never a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield None, -1
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            yield None, -1
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False, fd
        else:
            yield True, fd
    finally:
        os.close(fd)


class Cache:
    """A byte-bounded cache folder shared by all ranks and workers on a node (see the module
    docstring). ``limit`` None means unbounded; ``wait`` is how long a download waits for room
    (files in use are never evicted) before :class:`StorageError`."""

    def __init__(self, root: str | os.PathLike[str] | None = None,
                 limit: str | int | None = None, *, wait: float = 600.0) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        if fcntl is None:
            raise StorageError(f"{self.root}: remote datasets are read through a cache that "
                               "needs POSIX file locks (fcntl), which this system lacks; copy "
                               "the dataset to a local folder and load that (docs/install.md)")
        self.limit = parse_limit(limit)
        self.wait = wait
        self.root.mkdir(parents=True, exist_ok=True)
        self.trust = trust_of(self.root)  # refuses a folder others could plant files in

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r}, limit={self.limit})"

    def dataset_dir(self, url: str, manifest: bytes) -> Path:
        """The folder of one dataset version: named after the URL's last part, keyed by the URL
        and the manifest's bytes (a re-conversion gets a new folder)."""
        key = hashlib.sha256(url.rstrip("/").encode() + b"\n" + manifest).hexdigest()[:20]
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[:40]
        folder = self.root / f"{slug or 'dataset'}-{key}"
        try:
            folder.mkdir()
            made = True
        except FileExistsError:
            made = False
        self.trust.check_folder(folder, made)
        return folder

    # -- accounting --------------------------------------------------------------------------
    def usage(self) -> int:
        """Bytes the data files, the partial downloads and the active reservations take (read
        under the cache-wide lock, so a download handing its reservation over to its finished
        file is never counted twice or not at all)."""
        with _flocked(self.root / ".lock", self.trust, shared=True):
            return sum(size for _, size, _ in self._entries()) + sum(
                self._reservations().values())

    def _files(self) -> Iterator[tuple[Path, os.stat_result]]:
        """(path, lstat) of every regular file in the dataset folders this process trusts
        (links, FIFOs and folders of untrusted users are never counted, locked or evicted)."""
        with os.scandir(self.root) as it:
            folders = list(it)
        for folder in folders:
            try:
                if not (folder.is_dir(follow_symlinks=False)
                        and self.trust.allows(folder.stat(follow_symlinks=False))):
                    continue
                with os.scandir(folder.path) as it:
                    entries = list(it)
            except OSError:  # removed meanwhile
                continue
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield Path(e.path), st

    def _entries(self) -> list[tuple[Path, int, float]]:
        """(path, size, last use) of every data file and partial download."""
        out = []
        for p, st in self._files():
            if KEPT.match(p.name) or p.name.endswith(".lock"):
                continue
            if p.name.startswith(".") and not p.name.endswith(".part"):
                continue
            if p.name.endswith(".part"):
                with _unheld(p.with_name(p.name[:-5] + ".lock")) as (free, _):
                    if free is False:
                        continue  # an active download: counted by its reservation
            out.append((p, st.st_size, st.st_mtime))
        return out

    def _reservations(self) -> dict[Path, int]:
        out = {}
        for lock, _ in self._files():
            if not (lock.name.startswith(".") and lock.name.endswith(".lock")):
                continue
            with _unheld(lock) as (free, fd):
                if free is False:  # read from the descriptor checked, never by name again
                    try:
                        out[lock] = int(os.pread(fd, 32, 0) or 0)
                    except ValueError:
                        pass
        return out

    def _reserve(self, lock_fd: int, lock: Path, size: int, block: bool, evict: bool) -> bool:
        """Make room for ``size`` bytes (evicting unused files, least recently used first) and
        record the reservation in the held download lock; False when ``block`` is off and
        there is no room now."""
        if self.limit is not None and size > self.limit:
            raise StorageError(f"{lock.parent}: {lock.name[1:-5]} is {size:,} bytes, more than "
                               f"cache_limit={self.limit:,}; raise cache_limit above it (it must "
                               "hold the files all local ranks and workers read at once)")
        deadline = time.monotonic() + self.wait
        while True:
            with _flocked(self.root / ".lock", self.trust):
                if self.limit is None or self._make_room(size, lock, evict):
                    os.ftruncate(lock_fd, 0)
                    os.pwrite(lock_fd, str(size).encode(), 0)
                    return True
            if not block:
                return False
            if time.monotonic() > deadline:
                raise StorageError(f"{self.root}: no room for {lock.name[1:-5]} ({size:,} "
                                   f"bytes) within cache_limit={self.limit:,} after "
                                   f"{self.wait:.0f} s: every cached file is in use. Raise "
                                   "cache_limit (it must hold the shards all local ranks "
                                   "and workers read at once, plus the prefetch)")
            time.sleep(0.05)

    def _make_room(self, size: int, mine: Path, evict: bool = True) -> bool:
        assert self.limit is not None
        reserved = sum(v for k, v in self._reservations().items() if k != mine)
        entries = sorted(self._entries(), key=lambda e: e[2])
        total = reserved + sum(s for _, s, _ in entries)
        for path, nbytes, _ in entries if evict else ():
            if total + size <= self.limit:
                break
            if path.name.endswith(".part") and path.name[:-5] + ".lock" == mine.name:
                continue  # our own partial download: resumed, not evicted
            if self._evict(path):
                total -= nbytes
        return total + size <= self.limit

    @staticmethod
    def _evict(path: Path) -> bool:
        """Remove ``path`` unless a reader holds it (its shared lock)."""
        with _unheld(path) as (free, _):
            if free:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return free is not False

    # -- the one entry point -------------------------------------------------------------------
    def open(self, folder: Path, name: str, url: str, size: int, sha256: str, *,
             storage_options: Mapping[str, Any] | None = None,
             policy: RetryPolicy = DEFAULT_POLICY, block: bool = True, evict: bool = True,
             chunk: int = CHUNK, claimed: Callable[[bool], None] | None = None) -> int | None:
        """A read-only descriptor of ``folder/name``, downloaded from ``url`` first if needed,
        holding a shared lock (so it is never evicted while open; close it to release). With
        ``block=False`` (prefetch), None when another process is downloading it or the cache
        has no room now; with ``evict=False`` it only fills free room. ``claimed``, when it has
        to download, is told before the download starts whether room was found (False: none
        now, and None is returned), so that prefetches can take room in plan order."""
        path = folder / name
        fd = self._open_cached(path)
        if fd is not None:
            return fd
        lock = folder / f".{name}.lock"
        lock_fd = self.trust.open(lock, os.O_RDWR | os.O_CREAT, write=True)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            except BlockingIOError:
                return None
            fd = self._open_cached(path)  # another process finished it while we waited
            if fd is not None:
                return fd
            try:
                room = self._reserve(lock_fd, lock, size, block, evict)
                if claimed is not None:
                    claimed(room)
                if not room:
                    return None
                return self._fetch(path, lock_fd, url, size, sha256, storage_options, policy,
                                   chunk)
            except OSError as exc:
                full = disk_full(exc, path, url, size)
                if full is None:
                    raise
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path.with_name(f".{name}.part"))
                raise full from exc
        finally:
            os.close(lock_fd)  # releases the download lock and with it the reservation

    def _open_cached(self, path: Path) -> int | None:
        while True:
            try:
                fd = self.trust.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return None
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not evicted between the open and the lock
                os.utime(path)  # last use, for the LRU order
                return fd
            os.close(fd)

    def _fetch(self, path: Path, lock_fd: int, url: str, size: int, sha256: str,
               storage_options: Mapping[str, Any] | None, policy: RetryPolicy,
               chunk: int) -> int:
        part = path.with_name(f".{path.name}.part")
        for _ in range(2):  # a mismatch may be a resumed part from an older file: refetch
            os.close(self.trust.open(part, os.O_WRONLY | os.O_CREAT, write=True))  # checked
            download(url, part, size, storage_options, policy, chunk)
            got = file_digest(part, os.O_NOFOLLOW)[1]
            if got == sha256:
                fd = self.trust.open(part, os.O_RDONLY)
                fcntl.flock(fd, fcntl.LOCK_SH)  # held from before the rename: never evicted
                # the reservation becomes the file at once
                with _flocked(self.root / ".lock", self.trust):
                    os.replace(part, path)
                    os.ftruncate(lock_fd, 0)
                dirfd = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(dirfd)
                finally:
                    os.close(dirfd)
                return fd
            os.unlink(part)
        raise CorruptRecordError(
            f"{url}: downloaded twice, its SHA-256 is {got}, the manifest says {sha256}; the "
            "stored file is damaged or was replaced without its manifest: re-convert or "
            "re-upload the dataset (nothing of it was kept)", file=url)


def disk_full(exc: OSError, path: Path, url: str, size: int | None = None
              ) -> StorageError | None:
    """A :class:`StorageError` naming ``path`` and ``url`` when ``exc`` is a full disk or
    quota (the default ``cache_limit`` is unbounded, so a dataset larger than the disk ends
    here), else None."""
    if exc.errno not in FULL:
        return None
    what = f" ({size:,} bytes)" if size is not None else ""
    why = exc.strerror or getattr(exc.__cause__, "strerror", None) or "no space left"
    return StorageError(
        f"{path}: the cache's disk is full ({why}) fetching {url}{what}; its partial "
        f"download was removed. Free space in {path.parent.parent}, or set cache_limit below the "
        "free space (the least recently used files are then evicted to make room), or choose "
        "a cache_dir on a larger disk", url=url, file=str(path))

