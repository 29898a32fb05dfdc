"""Datasets in object storage: the manifest and index files are fetched into the node-local
cache (:class:`feedpipe.storage.cache.Cache`), then a local reader runs on the cache folder.

WebDataset shards are fetched as the reader opens them, and ahead of it in the loader's plan
order (:meth:`RemoteWdsReader.plan_ahead`). LMDB and HDF5 are one file each: fetched whole,
refused when larger than ``cache_limit``, and held in the cache (a shared lock) while a reader
of it lives in a process. Every request is bounded by the retry policy's ``timeout``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from ..errors import BadInputError, RemoteNotFoundError, StorageError
from ..paths import write_atomic
from ..schema.fields import Field
from ..storage import DEFAULT_POLICY, RetryPolicy, join, read_bytes
from ..storage.cache import Cache, disk_full
from .formats.base import DatasetReader, Visitor
from .formats.handles import OpenFiles
from .formats.hdf5 import Hdf5Reader
from .formats.lmdb import LmdbReader
from .formats.wds import CRC_FILE, INDEX_FILES, VALUES_FILE, WdsReader
from .manifest import FORMAT_FILES, MANIFEST_NAME, FileEntry, Manifest

log = logging.getLogger("feedpipe.storage")
#: concurrent prefetch downloads in a process: while one shard's download ends (its SHA-256,
#: its fsync), the others keep the link busy
PREFETCH_THREADS = 4


class RemoteSource:
    """Where one cached dataset's files come from: its URL, the cache folder, the manifest's
    sizes and SHA-256s, and how to reach the store."""

    def __init__(self, url: str, cache: Cache, folder: Path, files: Sequence[FileEntry],
                 storage_options: Mapping[str, Any] | None, policy: RetryPolicy) -> None:
        self.url, self.cache, self.folder, self.policy = url, cache, folder, policy
        self.files = {f.name: f for f in files}
        self.storage_options = dict(storage_options or {})

    def open(self, name: str, block: bool = True, evict: bool = True,
             claimed: Callable[[bool], None] | None = None) -> int | None:
        """A shared-locked descriptor of the cached file ``name`` (fetched and verified first;
        the arguments as :meth:`Cache.open`'s)."""
        entry = self.files.get(name)
        if entry is None:
            raise BadInputError(f"{self.url}: its manifest lists no file {name}; "
                                "re-convert the dataset")
        flat = name.replace("%", "%25").replace("/", "%2F")  # a merged dataset's parts/.../x.tar
        return self.cache.open(self.folder, flat, join(self.url, name), entry.size, entry.sha256,
                               storage_options=self.storage_options, policy=self.policy,
                               block=block, evict=evict, claimed=claimed)

    def fd(self, name: str) -> int:
        """:meth:`open`, waiting for the file: a descriptor, never None."""
        fd = self.open(name)
        assert fd is not None
        return fd


class _Turn:
    """One prefetch's place in plan order: it claims cache room once the prefetch before it
    has (so four downloads at once still take room in plan order), and skips when that one
    found none (it would take the room the sooner shard needs). ``first`` (the first of a
    plan_ahead call) only waits: the room may have come free since."""

    def __init__(self, before: _Turn | None, first: bool) -> None:
        self.before, self.first = before, first
        self.room, self.done = True, threading.Event()

    def wait(self) -> bool:
        """Block until the prefetch before has claimed; whether this one may claim too."""
        before, self.before = self.before, None  # the chain does not grow without bound
        if before is None:
            return True
        before.done.wait()
        return self.first or before.room

    def end(self, room: bool) -> None:
        if not self.done.is_set():
            self.room = room
            self.done.set()


class _Prefetcher:
    """Daemon threads running prefetches in submission order: a finished process never waits
    for one (a ThreadPoolExecutor's threads are joined at exit, so a prefetch retrying a silent
    store kept the process alive). Ended by :meth:`shutdown`, or when its reader is collected."""

    def __init__(self, threads: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"feedpipe-prefetch-{n}",
                                          daemon=True) for n in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._jobs.put((fn, args))

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args = job
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - a prefetch is best effort; the reader fetches
                log.debug("prefetch failed", exc_info=True)
            del job, fn, args  # the reader it names may be collected while this thread waits

    def shutdown(self, wait: bool = True) -> None:
        """End the threads once the jobs submitted so far have run (``wait``: block until)."""
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class RemoteWdsReader(WdsReader):
    """A WdsReader over the cache folder whose shard opens fetch through the cache. A batch is
    read one shard at a time, each released before the next is opened, so a process holds (and
    keeps from eviction) one shard at a most: a cache of a few shards per process never stalls."""

    # the prefetch threads: this process's own
    _handles: ClassVar[tuple[str, ...]] = (*WdsReader._handles, "_pool", "_turn")
    _pool: tuple[int, _Prefetcher] | None
    _turn: _Turn | None

    def __init__(self, root: Path, manifest: Manifest, source: RemoteSource,
                 prefetch: int = 2, **options: Any) -> None:
        self.source, self.prefetch = source, prefetch
        self._queued: set[int] = set()  # reset with each process's new pool
        super().__init__(root, manifest, **options)

    def describe(self, index: int) -> str:
        return f"{self.source.url} (wds, cached in {self.root}) shard " \
               f"{self.shards[int(self._shard_of[index])]} key {self.key_of(index)}"

    def _open_shard(self, shard: int) -> int:
        return self.source.fd(self.shards[shard])

    def _release(self) -> None:
        if self._fds is not None:
            self._fds.clear()  # their shared locks go: evictable once unused

    def _visit(self, indices: Sequence[int], fn: Visitor, fields: list[Field]) -> None:
        shard_of = self._shard_of[np.asarray(indices, np.int64)]
        stored: list[dict[str, Any] | None] = [None] * len(indices)
        for shard in dict.fromkeys(int(s) for s in shard_of):  # in the batch's order
            positions = [p for p, s in enumerate(shard_of) if s == shard]
            self._release()
            self._fd(shard)  # fetched here: a StorageError stays typed (not a damaged record)

            def keep(pos: int, values: dict[str, Any], positions: list[int] = positions) -> None:
                stored[positions[pos]] = values  # pread copies: valid after the callback

            super()._visit([indices[p] for p in positions], keep, fields)
        self._release()
        for pos, values in enumerate(stored):  # the caller's order: its random draws follow it
            assert values is not None
            fn(pos, values)

    def plan_ahead(self, plan: Sequence[Sequence[int] | np.ndarray], position: int) -> None:
        """Fetch the shards of the next batches, up to ``prefetch`` beyond batch ``position``'s,
        in plan order, in a small thread pool: only into free room (never evicting), a sooner
        shard's room before a later's; a cached shard is marked used, so it is evicted last."""
        if self.prefetch <= 0 or not len(plan):
            return
        window: list[int] = []
        current = 0
        for b in range(position, len(plan)):
            for s in self._shard_of[np.asarray(plan[b], np.int64)].tolist():
                if s not in window:
                    window.append(int(s))
            if b == position:
                current = len(window)
            if len(window) >= current + self.prefetch:
                break
        pid = os.getpid()
        if self._pool is None or self._pool[0] != pid:
            pool = _Prefetcher(PREFETCH_THREADS)
            weakref.finalize(self, pool.shutdown, False).atexit = False
            self._pool = (pid, pool)
            self._queued, self._turn = set(), None
        self._queued &= set(window)
        first = True
        for shard in window:
            if shard in self._queued:  # fetched already: mark it used, so the shards the plan
                try:                   # has passed are the least recently used, evicted first
                    os.utime(self.root / self.shards[shard])
                except FileNotFoundError:
                    self._queued.discard(shard)  # evicted meanwhile: fetch it again
            if shard not in self._queued:
                self._queued.add(shard)
                self._turn = _Turn(self._turn, first)
                first = False
                self._pool[1].submit(self._prefetch, shard, self._turn)

    def _prefetch(self, shard: int, turn: _Turn) -> None:
        try:
            if not turn.wait():
                turn.end(False)  # so the ones after it skip too
                return
            fd = self.source.open(self.shards[shard], block=False, evict=False,
                                  claimed=turn.end)
        except Exception:  # noqa: BLE001 - the reader's own open raises it, named, if needed
            log.debug("prefetch of %s failed; the reader fetches it on demand",
                      self.shards[shard], exc_info=True)
            return
        finally:
            turn.end(True)  # no-op once told; else (cached, busy, failed) the next goes on
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        if self._pool is not None and self._pool[0] == os.getpid():
            self._pool[1].shutdown(wait=False)  # its queued prefetches still run
        self._pool, self._queued, self._turn = None, set(), None
        super().close()


class _PinnedReader(DatasetReader):
    """A single-file remote dataset's reader: in each process that reads it, the cached data
    file is held (a shared lock: never evicted under the reader) from its open until
    :meth:`close` or the reader's garbage collection; a process that opens it again fetches it
    again if it was evicted meanwhile."""

    source: RemoteSource
    data_file: str
    _pin: OpenFiles | None = None

    def pin(self, fd: int) -> None:
        """Hold ``fd`` (the data file, shared-locked) for this reader in this process."""
        if self._pin is not None:
            self._pin.close()
        self._pin = OpenFiles(self, 1)
        self._pin.add(0, fd)

    def _ensure_open(self) -> None:
        pin = self._pin
        if self._pid != os.getpid() and (pin is None or pin.pid != os.getpid() or not len(pin)):
            self.pin(self.source.fd(self.data_file))
        super()._ensure_open()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_pin"] = None  # a descriptor of this process: the other pins its own
        return state

    def close(self) -> None:
        super().close()
        if self._pin is not None:
            self._pin.close()
        self._pin = None


class RemoteLmdbReader(_PinnedReader, LmdbReader):
    """An LMDB dataset fetched whole into the cache, held there while read."""


class RemoteHdf5Reader(_PinnedReader, Hdf5Reader):
    """An HDF5 dataset fetched whole into the cache, held there while read."""


def open_remote(url: str, *, cache_dir: str | os.PathLike[str] | None = None,
                cache_limit: str | int | None = None,
                storage_options: Mapping[str, Any] | None = None, prefetch: int = 2,
                policy: RetryPolicy = DEFAULT_POLICY, timeout: float | None = None,
                **options: Any) -> DatasetReader:
    """Open the dataset at ``url`` through the node-local cache (see the module docstring).
    ``timeout``: seconds each request waits to connect or for its next bytes; a request gives
    up after four times that (:meth:`RetryPolicy.with_timeout`; None: ``policy``'s)."""
    policy = RetryPolicy.with_timeout(timeout, policy)
    try:
        raw = read_bytes(join(url, MANIFEST_NAME), storage_options, policy)
    except RemoteNotFoundError as exc:
        raise BadInputError(
            f"{url}: no {MANIFEST_NAME}; the path is wrong, or the conversion did not finish "
            "(the manifest is written last). Check the URL, or re-run `feedpipe convert`.",
            dataset=url) from exc
    cache = Cache(cache_dir, cache_limit)
    folder = cache.dataset_dir(url, raw)
    if not (folder / MANIFEST_NAME).is_file():
        try:
            write_atomic(folder / MANIFEST_NAME, raw)
        except OSError as exc:
            full = disk_full(exc, folder / MANIFEST_NAME, join(url, MANIFEST_NAME))
            if full is None:
                raise
            raise full from exc
    manifest = Manifest.read(folder)
    source = RemoteSource(url, cache, folder, manifest.files, storage_options, policy)
    if manifest.format == "wds":  # the index files at once: one round trip, not five in a row
        names = [n for n in (*INDEX_FILES, CRC_FILE, VALUES_FILE) if n in source.files]
        with ThreadPoolExecutor(len(names), thread_name_prefix="feedpipe-index") as pool:
            list(pool.map(lambda name: os.close(source.fd(name)), names))  # cached, not held
        return RemoteWdsReader(folder, manifest, source, prefetch, **options)
    data = FORMAT_FILES[manifest.format][0]
    entry = source.files.get(data)
    if entry is not None and cache.limit is not None and entry.size > cache.limit:
        raise StorageError(f"{url}: {manifest.format} keeps all samples in one file "
                           f"({data}, {entry.size:,} bytes), larger than cache_limit="
                           f"{cache.limit:,}, and must be fetched whole. Convert it with "
                           "`feedpipe convert ... --to wds` for remote data (shards stream one "
                           "by one within the limit), or raise cache_limit", url=url)
    pin = source.fd(data)  # held while the reader lives: the file is never evicted under it
    single = RemoteLmdbReader if manifest.format == "lmdb" else RemoteHdf5Reader
    try:
        reader = single(folder, manifest, **options)
    except BaseException:
        os.close(pin)
        raise
    reader.source, reader.data_file = source, data
    reader.pin(pin)
    return reader
