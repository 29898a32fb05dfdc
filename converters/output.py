"""Where a conversion writes: one :class:`Output` over the output's
:class:`~feedpipe.storage.store.Store` (a local folder or an object-store URL), the check that keeps
it out of the source, and the failures worth a clear message.

The writers need local files, so every output stages locally and publishes each finished file;
what "publish" and "commit" mean is the store's commit policy: :class:`~converters.swap.SwapCommit`
(a folder: files are final where they are written, the ``.<out>.partial`` folder is swapped into
place after the manifest) or :class:`~converters.upload.ManifestCommit` (an object store: shards
uploaded as they finish, journaled; the manifest uploaded last is the commit point).
"""

from __future__ import annotations

import errno
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from threading import BoundedSemaphore
from typing import Any, Callable, Iterable, Mapping, NoReturn

from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry
from feedpipe.dataset.registry import DatasetWriter
from feedpipe.errors import BadInputError, ResourceError
from feedpipe.storage.store import DirStore, UrlStore, open_store
from feedpipe.storage.store import is_remote as _is_remote
from feedpipe.system import file_size_limit

from .sources import Source
from .swap import FULL, SwapCommit, shown
from .upload import ManifestCommit

_FULL_TEXT = tuple(os.strerror(e) for e in FULL)
UPLOAD_THREADS = 4  # uploads at once: a store answers each PUT at its own pace
MAX_QUEUED = 4  # staged shards waiting for upload before the packer waits (bounds local disk)


def is_remote(out: str | os.PathLike[str]) -> bool:
    """True for an object-storage URL given as a str (feedpipe.storage.is_remote: an unknown
    scheme raises ConfigError); a pathlib.Path is never one."""
    return isinstance(out, str) and _is_remote(out)


class Output:
    """One conversion's output: ``claim()`` checks and locks it and returns the staging folder,
    ``after_write()`` publishes the shards a writer has finished (an object store: uploaded in
    the background), ``entry()`` publishes a closed file and gives its size and SHA-256,
    ``commit()`` makes the dataset visible, ``abort()`` drops the staged files."""

    def __init__(self, out: str | Path, overwrite: bool,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        store = open_store(out if is_remote(out) else Path(out), storage_options)
        self.policy: SwapCommit | ManifestCommit
        if isinstance(store, UrlStore):
            self.policy = ManifestCommit(store, overwrite)
        else:
            assert isinstance(store, DirStore)
            self.policy = SwapCommit(store, overwrite)
        self.lock = self.policy.lock
        self._entries: dict[Path, Future[FileEntry]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._queued = BoundedSemaphore(MAX_QUEUED)

    def claim(self, source: Source | None) -> Path:
        """Check, lock and make the staging folder; ``source`` None: data from memory (no source
        tree for the output to stay out of)."""
        if source is not None and isinstance(self.policy, SwapCommit):
            check_not_source(source, self.policy.out)
        self.lock.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            staging = self.policy.claim()
        except BaseException:
            self.lock.release()
            raise
        if self.policy.eager:
            self._pool = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="feedpipe-upload")
        return staging

    def _submit(self, path: Path) -> None:
        assert self._pool is not None
        self._queued.acquire()  # backpressure: the packer waits when uploads fall behind
        fut = self._pool.submit(self.policy.publish, path)
        fut.add_done_callback(lambda _: self._queued.release())
        self._entries[path] = fut

    def after_write(self, root: Path, writer: DatasetWriter) -> None:
        """Publish every shard the writer has finished (all but the one it writes to), where the
        policy publishes eagerly."""
        if self._pool is None:
            return
        for name in getattr(writer, "shards", [])[:-1]:
            if root / name not in self._entries:
                self._submit(root / name)
        for fut in self._entries.values():  # a failed upload stops the conversion now
            if fut.done() and fut.exception() is not None:
                fut.result()

    def entry(self, root: Path, name: str) -> FileEntry:
        """A closed data file's size and SHA-256 for the manifest, published first."""
        if self._pool is None:
            return self.policy.publish(root / name)
        if root / name not in self._entries:
            self._submit(root / name)
        return self._entries[root / name].result()

    def commit(self) -> None:
        """Wait for the publishing, commit (see the policies), release the lock."""
        try:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                for fut in self._entries.values():
                    fut.result()
            self.policy.commit()
        finally:
            self.lock.release()

    def abort(self) -> None:
        """Stop publishing and drop the staged files (see the policies); release the lock."""
        try:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            self.policy.abort()
        finally:
            self.lock.release()


# --- the source stays out of the output ---------------------------------------------------------

def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def check_not_source(source: Source, out: Path) -> None:
    """Refuse an output that is, contains or lies inside the source (symlinks resolved).

    A folder source is its tree. For a CSV/JSONL manifest it is every folder holding a listed
    image, and the manifest's own folder may not be the output or inside it.
    """
    o = Path(os.path.realpath(out))
    root = Path(os.path.realpath(source.root))
    trees = {root}
    if source.kind == "manifest":
        trees = {Path(os.path.realpath(d)) for d in {i.path.parent for i in source.items}}
        if _inside(root, o):
            raise BadInputError(f"{out}: the output is or contains {root}, the folder of "
                                "the source manifest. Choose an -o outside it.")
    for t in sorted(trees):
        if _inside(o, t):
            rel = "is" if o == t else "lies inside"
            raise BadInputError(f"{out}: the output {rel} the source {t}; writing there "
                                "would mix the dataset into (or delete) your images. Choose "
                                "an -o outside the source.")
        if _inside(t, o):
            raise BadInputError(f"{out}: the output contains the source {t}; --overwrite "
                                "would delete your images. Choose an -o outside the source.")


# --- failures worth a clear message -------------------------------------------------------------

def abandon(exc: BaseException, writers: Iterable[DatasetWriter], output: Output,
            out: Path, partial: Path) -> NoReturn:
    """After a failed conversion: discard the writers (a failed one loses to ``exc``), remove the
    partial output, and raise: :class:`ResourceError` (from ``exc``) when the disk filled, else
    ``exc`` itself."""
    for writer in writers:
        try:
            writer.discard()
        except Exception:  # the original error matters more than a failed cleanup
            pass
    full = disk_full(exc, out, partial)
    output.abort()
    if full is None:
        raise exc
    raise full from exc


def disk_full(exc: BaseException, out: Path, partial: Path) -> ResourceError | None:
    """A typed error if ``exc`` comes from a full disk, quota or file-size limit.

    Call it before removing ``partial``: LMDB reports a failed page write as EIO, so when the error
    carries no errno of its own, the partial output's filesystem and sizes are checked instead.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if (isinstance(seen, OSError) and seen.errno in FULL) or \
                any(t in str(seen) for t in _FULL_TEXT):
            break
        seen = seen.__cause__ or seen.__context__
    vague = type(exc).__module__ == "lmdb" or (isinstance(exc, OSError) and
                                                exc.errno in (None, errno.EIO))
    if seen is None and vague and _exhausted(partial):
        seen = exc
    if seen is None:
        return None
    return ResourceError(f"{out}: the output's filesystem is full or a file size limit was hit "
                         f"({seen}); the partial output was removed and nothing else was "
                         "changed. Free space or choose another -o.", errno=errno.ENOSPC)


def _exhausted(partial: Path) -> bool:
    """Less than 1 MiB free where ``partial`` lives, or a file in it at the RLIMIT_FSIZE limit."""
    try:
        if shutil.disk_usage(partial).free < 1 << 20:
            return True
        limit = file_size_limit()
        return limit is not None and any(
            p.stat().st_size >= limit - (64 << 10) for p in partial.rglob("*") if p.is_file())
    except OSError:
        return False


def empty_result(where: str, counts: dict[str, int], skipped: list[dict[str, Any]],
                 why: Callable[[list[dict[str, Any]]], str]) -> BadInputError | None:
    """Zero samples written (or an empty train/val split) is an error that says why: ``why``
    tells it from the skip list (:func:`why_empty` for a folder or manifest source)."""
    total = sum(counts.values())
    if total and all(counts.values()):
        return None
    if total:
        empty = [k for k, v in counts.items() if not v]
        return BadInputError(f"the {empty[0]} split got 0 of {total} samples: raise "
                             "--val-fraction, or leave it out for a single dataset")
    return BadInputError(f"{where}: wrote 0 samples: {why(skipped)}")


def why_empty(source: Source, skipped: list[dict[str, Any]]) -> str:
    """Why a folder or manifest source gave no sample: missing paths, skips, or what it holds."""
    if source.items:
        missing = [i.rel for i in source.items if not i.path.exists()]
        if missing:
            return (f"{len(missing)} of {len(source.items)} listed paths do not exist (relative "
                    f"to {source.root}): {shown(missing, 3)}")
        return f"all {len(skipped)} inputs were skipped: " + "; ".join(
            f"{s['path']}: {s['reason']}" for s in skipped[:3])
    root = Path(source.root)
    files = []
    for p in root.rglob("*"):
        if p.is_file():
            files.append(p.relative_to(root).as_posix())
            if len(files) >= 10_000:
                break
    names = {Path(f).name for f in files}
    if names & {MANIFEST_NAME, "data.mdb", "data.h5"}:
        return (f"{root} is already a packed dataset ({shown(sorted(names))}); open it with "
                "feedpipe.open_dataset / `feedpipe info`, or convert the original images")
    tars = [f for f in files if f.lower().endswith(".tar")]
    if tars:
        return (f"{root} holds {len(tars)} .tar files ({shown(tars, 3)}): looks like WebDataset "
                f"shards; `feedpipe convert {root}` packs them, or from Python "
                "converters.convert(converters.foreign_wds.source([DIR]), ...); "
                "`feedpipe index` reads them in place")
    if files:
        return f"no image files found ({len(files)} other files, e.g. {shown(files, 3)})"
    return "the source holds no files"
