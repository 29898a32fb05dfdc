"""The node-local cache of remote dataset files: bounded in bytes, shared by every process on
the node, one download per file per node, and nothing partial ever read as whole.

``<cache_dir>/<name>-<key>/`` per dataset, ``key`` a hash of the URL and the manifest's bytes (a
re-converted dataset never mixes with a stale copy), holds the manifest and index files (kept),
the data files (counted against ``limit``, evicted least recently used first), and per data file
``.NAME.lock`` (the download lock, holding the bytes reserved) and ``.NAME.part`` (the bytes so
far). A reader holds a shared ``flock`` on its file, so it is never evicted while open; the kernel
releases a dead process's locks, and a killed download resumes from its part file.

The folder may be reachable by other users: nothing in it is opened through a symlink (a planted
``.NAME.lock`` link would have its target truncated) or unless it is a regular file (a FIFO
blocks forever), and only what a trusted user made is used. A root owned by this user (or
world-writable with the sticky bit, as ``/tmp``) is private; a group-writable setgid root
(``chmod 2770``) is shared by its group (docs/remote.md); any other root is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..errors import CorruptRecordError, StorageError
from ..paths import cache_dir
from .retry import DEFAULT_POLICY, RetryPolicy
from .sizes import parse_size
from .store import file_digest
from .transfer import CHUNK, FULL, download, open_plain

try:
    import fcntl  # shared and exclusive locks on open files (flock): POSIX
except ImportError:  # Windows: Cache() refuses, naming it
    fcntl = None  # type: ignore[assignment]

KEPT = re.compile(r"^(feedpipe\.json|index-.*)$")  # the manifest and index files: never evicted


_SHARE = ("a group-shared cache is a folder of that group with the setgid bit: chgrp GROUP DIR "
          "&& chmod 2770 DIR (docs/remote.md, 'Sharing a cache')")


@dataclass(frozen=True)
class Trust:
    """The owners a cache's entries may have: this user, and a shared cache's group."""

    uid: int
    gid: int | None = None  # the group of a group-shared cache; None: private

    @classmethod
    def of(cls, root: Path) -> Trust:
        """The trust of an existing cache root (see the module docstring); refuses an unsafe one."""
        st = os.stat(root)  # the root may be a link the user chose; what lies in it never is
        mode = stat.S_IMODE(st.st_mode)
        shared = bool(mode & stat.S_IWGRP and st.st_mode & stat.S_ISGID)
        trust = cls(os.geteuid(), st.st_gid if shared else None)
        trust._refuse_open_to_all(root, st, "folder")
        if st.st_uid != trust.uid and not shared and not (mode & stat.S_IWOTH
                                                          and st.st_mode & stat.S_ISVTX):
            raise StorageError(f"{root}: the cache folder belongs to user id {st.st_uid}, not "
                               "to you: its owner could plant links or files in it. Use a "
                               f"cache_dir of your own ($FEEDPIPE_CACHE); {_SHARE}")
        return trust

    def allows(self, st: os.stat_result) -> bool:
        return st.st_uid == self.uid or (self.gid is not None and st.st_gid == self.gid)

    @staticmethod
    def _refuse_open_to_all(path: Path, st: os.stat_result, what: str) -> None:
        if stat.S_IMODE(st.st_mode) & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise StorageError(f"{path}: the cache {what} is writable by every user (mode "
                               f"{stat.S_IMODE(st.st_mode):o}, no sticky bit): anyone could "
                               "plant links or files in it. Use a private cache_dir "
                               f"($FEEDPIPE_CACHE), or chmod o-w {path}; {_SHARE}")

    def check_folder(self, folder: Path, made: bool) -> None:
        """A dataset folder: a real folder (never a link) a trusted user made; one this process
        ``made`` in a shared cache becomes group-writable."""
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode):
            raise StorageError(f"{folder}: in the cache, not a folder (a symlink or a file); "
                               "feedpipe never follows one there. Remove it and run again.")
        if not self.allows(st):
            raise StorageError(f"{folder}: made by user id {st.st_uid}, not by you (nor in "
                               "the cache's shared group); feedpipe does not use it. Remove "
                               "it, or use a cache_dir of your own")
        self._refuse_open_to_all(folder, st, "folder")
        if made and self.gid is not None:
            os.chmod(folder, stat.S_IMODE(st.st_mode) | stat.S_ISGID | 0o070)

    def open(self, path: Path, flags: int, write: bool = False) -> int:
        """:func:`open_plain` of a cache entry a trusted user made. A file of this user in a
        shared cache is made group-writable, so the group's other users can resume or lock it."""
        fd = open_plain(path, flags, "in the cache", write)
        try:
            st = os.fstat(fd)
            if not self.allows(st):
                raise StorageError(f"{path}: in the cache, made by user id {st.st_uid}, not by "
                                   "you (nor in the cache's shared group); feedpipe does not "
                                   "open it. Remove it, or use a cache_dir of your own.")
            if self.gid is not None and st.st_uid == self.uid and not st.st_mode & stat.S_IWGRP:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o060)
        except BaseException:
            os.close(fd)
            raise
        return fd


def parse_limit(value: str | int | None) -> int | None:
    """``cache_limit``'s bytes (:func:`~feedpipe.storage.sizes.parse_size`); None: no limit."""
    return None if value is None else parse_size(value, "cache_limit")


def default_cache_dir() -> Path:
    """``$FEEDPIPE_CACHE``, else ``remote`` in feedpipe's cache folder (``~/.cache/feedpipe``)."""
    env = os.environ.get("FEEDPIPE_CACHE")
    return Path(env) if env else cache_dir() / "remote"


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
        self.trust = Trust.of(self.root)  # refuses a folder others could plant files in

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
        """Bytes the data files, partial downloads and active reservations take, read under the
        cache-wide lock (a reservation becoming its finished file is counted once)."""
        with _flocked(self.root / ".lock", self.trust, shared=True):
            entries, reserved = self._scan()
            return reserved + sum(size for _, size, _ in entries)

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

    def _scan(self, mine: Path | None = None) -> tuple[list[tuple[Path, int, float]], int]:
        """(path, size, last use) of every data file and idle partial download, and the bytes
        the active downloads other than ``mine`` reserved in their locks."""
        entries, reserved = [], 0
        for p, st in self._files():
            name = p.name
            if name.startswith(".") and name.endswith(".lock"):
                if p != mine:
                    with _unheld(p) as (free, fd):
                        if free is False:  # read from the descriptor checked, not by name
                            with contextlib.suppress(ValueError):
                                reserved += int(os.pread(fd, 32, 0) or 0)
                continue
            if KEPT.match(name) or name.endswith(".lock") or (
                    name.startswith(".") and not name.endswith(".part")):
                continue
            if name.endswith(".part"):
                with _unheld(p.with_name(name[:-5] + ".lock")) as (free, _):
                    if free is False:
                        continue  # an active download: counted by its reservation
            entries.append((p, st.st_size, st.st_mtime))
        return entries, reserved

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

    def _make_room(self, size: int, mine: Path, evict: bool) -> bool:
        """Whether ``size`` more bytes fit, after evicting (``evict``) the files no reader holds,
        least recently used first (``mine``: the download lock whose part file is resumed)."""
        assert self.limit is not None
        entries, total = self._scan(mine)
        total += sum(s for _, s, _ in entries)
        for path, nbytes, _ in sorted(entries, key=lambda e: e[2]) if evict else ():
            if total + size <= self.limit:
                break
            if path.name == mine.name[:-5] + ".part":  # our own partial download: resumed
                continue
            with _unheld(path) as (free, _):  # False: a reader holds its shared lock
                if free:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            if free is not False:
                total -= nbytes
        return total + size <= self.limit

    # -- the one entry point -------------------------------------------------------------------
    def open(self, folder: Path, name: str, url: str, size: int, sha256: str, *,
             storage_options: Mapping[str, Any] | None = None,
             policy: RetryPolicy = DEFAULT_POLICY, block: bool = True, evict: bool = True,
             chunk: int = CHUNK, claimed: Callable[[bool], None] | None = None) -> int | None:
        """A read-only descriptor of ``folder/name`` (downloaded from ``url`` first if needed)
        holding a shared lock: never evicted while open. ``block=False`` (prefetch): None when
        another process is downloading it or there is no room now; ``evict=False``: free room
        only. ``claimed`` is told before a download whether room was found (prefetches take
        room in plan order)."""
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

