"""A conversion into object storage (``s3://``, ``gs://``...): stage locally, upload, manifest last.

On an object store there is no rename to swap a finished folder into place; the manifest is the
commit point instead. Samples are packed into a local staging folder; each WebDataset shard is
uploaded (by a small thread pool) as soon as the writer moves on to the next one and its staged copy
is removed, so local disk holds a few shards, not the dataset. LMDB and HDF5 are single files,
uploaded after they close. The manifest goes up last: an interrupted conversion leaves no manifest,
so nothing reads it as a dataset.

What feedpipe uploaded is recorded in an upload journal (``.feedpipe-upload.json``) beside the
data, before each upload (``pending``) and after it (``done``, with the size and SHA-256; stored
with the next journal write, so concurrent uploads share one PUT). A re-run
skips every ``done`` object whose staged copy has the same SHA-256 and whose stored size matches
(conversions are deterministic), and at the end removes the objects of the journal that the new
manifest does not list. A destructive step only touches what feedpipe made: ``overwrite`` removes
the old manifest first (the old dataset then reads as incomplete), and afterwards only the objects
that the old manifest or the journal lists. A prefix holding anything else is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry
from feedpipe.dataset.registry import DatasetWriter
from feedpipe.errors import ConfigError, OutputRefusedError, RemoteNotFoundError, StorageError
from feedpipe.paths import cache_dir
from feedpipe.storage import filesystem, with_retries
from feedpipe.storage import is_remote as _is_remote

from .output import OutputLock, _shown

log = logging.getLogger(__name__)

JOURNAL = ".feedpipe-upload.json"
SPLITS = ("", "train/", "val/")  # where a conversion's manifests lie, relative to the URL
READ_ONLY = ("http://", "https://")
UPLOAD_THREADS = 4  # uploads at once: a store answers each PUT at its own pace
MAX_QUEUED = 4  # staged shards waiting for upload before the packer waits (bounds local disk)


class RemoteOutput:
    """One conversion's remote output, with the interface of :class:`converters.output.Output`:
    ``claim()`` checks the URL and returns the staging folder, ``after_write()`` uploads finished
    shards, ``entry()`` gives each file's size and hash, ``commit()`` uploads the rest and the
    manifest last, ``abort()`` keeps what was uploaded (journaled) for a re-run."""

    def __init__(self, url: str, overwrite: bool,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.url, self.overwrite = url.rstrip("/"), overwrite
        if url.lower().startswith(READ_ONLY):
            raise ConfigError(f"{url}: feedpipe reads datasets over http(s) but cannot write "
                              "there; convert to an object store (s3://, gs://...) or a local "
                              "folder and serve that")
        self.fs, root = filesystem(url, storage_options)
        self.root = root.rstrip("/")
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.staging = cache_dir() / "staging" / digest
        self.lock = OutputLock(self.staging)  # two conversions of one URL on this machine
        self.journal: dict[str, dict[str, Any]] = {}
        self.skipped_uploads = 0  # objects a re-run found uploaded already
        self._entries: dict[Path, Future[FileEntry]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._jlock = threading.RLock()  # the journal in memory
        self._put_lock = threading.Lock()  # one journal PUT at a time
        self._version = self._stored = 0  # journal versions: the newest, the newest stored
        self._queued = threading.BoundedSemaphore(MAX_QUEUED)

    def key(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    # --- claim ----------------------------------------------------------------------------------

    def claim(self, source: object = None) -> Path:
        """Check what the URL holds (see the module docstring), lock and make the staging folder."""
        self.staging.parent.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            self._check_remote()
            if self.staging.exists():  # a killed run's staging folder: ours by its place
                shutil.rmtree(self.staging)
            self.staging.mkdir()
        except BaseException:
            self.lock.release()
            raise
        self._pool = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="feedpipe-upload")
        return self.staging

    def _check_remote(self) -> None:
        self.fs.invalidate_cache()
        try:
            held = {p[len(self.root) + 1:] for p in self.fs.find(self.root)}
        except FileNotFoundError:
            held = set()
        bucket = self.root.split("/")[0]
        if not held and not self._retry(lambda: self.fs.exists(bucket), "", "look for the bucket"):
            scheme = self.url.partition("://")[0]
            raise RemoteNotFoundError(f"{scheme}://{bucket}: no such bucket; create it, or check "
                                      f"its name and the endpoint, before writing {self.url}",
                                      url=self.url)
        self.journal = self._read_json(JOURNAL) or {} if JOURNAL in held else {}
        self.journal = dict(self.journal.get("files", {}))
        manifests = {s + MANIFEST_NAME: self._read_json(s + MANIFEST_NAME)
                     for s in SPLITS if s + MANIFEST_NAME in held}
        ours = {JOURNAL, *manifests, *self.journal}
        for name, m in manifests.items():
            if m is None or "feedpipe_manifest" not in m:
                raise OutputRefusedError(f"{self.key(name)}: not a feedpipe manifest; refusing to "
                                         "write over it. Choose another -o or remove it yourself.")
            split = name[:-len(MANIFEST_NAME)]
            ours |= {split + str(f["name"]) for f in m.get("files", [])}
        foreign = sorted(held - ours)
        if foreign:
            raise OutputRefusedError(f"{self.url}: holds objects feedpipe did not make "
                                     f"({_shown(foreign)}); choose another -o, or move them out "
                                     "first")
        if manifests and not self.overwrite:
            raise FileExistsError(f"{self.url} holds a dataset ({_shown(sorted(manifests))}); "
                                  "pass overwrite=True (--overwrite) to replace it")
        if manifests:  # the old dataset's objects become ours to remove, then it is uncommitted
            for name, m in manifests.items():
                split = name[:-len(MANIFEST_NAME)]
                for f in [*m.get("files", []), {"name": MANIFEST_NAME}]:  # type: ignore[union-attr]
                    self.journal.setdefault(split + str(f["name"]), {"state": "old"})
            self._save_journal()
            self.fs.rm([self.key(n) for n in manifests])
        elif self.journal:
            log.info("%s: resuming an unfinished conversion (%d objects journaled)", self.url,
                     len(self.journal))

    def _read_json(self, rel: str) -> dict[str, Any] | None:
        try:
            d = json.loads(self.fs.cat_file(self.key(rel)))
        except (OSError, ValueError):
            return None
        return d if isinstance(d, dict) else None

    def _note(self, rel: str, state: dict[str, Any]) -> int:
        """Record ``rel``'s state in the journal (in memory); the journal's new version."""
        with self._jlock:
            self.journal[rel] = state
            self._version += 1
            return self._version

    def _save_journal(self, version: int | None = None) -> None:
        """Store a journal at least as new as ``version`` (None: the state now, even unchanged).
        One PUT at a time, each of the newest state: uploads that ask meanwhile are covered by
        one PUT (an older copy never lands after a newer one)."""
        if version is None:
            with self._jlock:
                self._version += 1
                version = self._version
        with self._put_lock:
            if self._stored >= version:  # a PUT made while this thread waited covered it
                return
            with self._jlock:
                body = json.dumps({"feedpipe_upload": 1, "output": self.url,
                                   "files": self.journal}, indent=1, sort_keys=True)
                current = self._version
            self._retry(lambda: self.fs.pipe_file(self.key(JOURNAL), body.encode()), JOURNAL,
                        "write the upload journal")
            self._stored = current

    # --- uploads --------------------------------------------------------------------------------

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.staging).as_posix()

    def _upload(self, path: Path, keep: bool = False) -> FileEntry:
        """Upload one staged file unless a re-run finds it there already; journaled both ways."""
        rel = self._rel(path)
        entry = FileEntry.of(path.parent, path.name)
        done = self.journal.get(rel, {})
        if done.get("state") == "done" and done.get("sha256") == entry.sha256 and \
                self._size(rel) == entry.size:
            self.skipped_uploads += 1
        else:
            self._save_journal(self._note(rel, {"state": "pending"}))  # stored before the upload
            self._retry(lambda: self.fs.put_file(str(path), self.key(rel)), rel, "upload")
            if self._size(rel) != entry.size:
                raise StorageError(f"{self.url}/{rel}: stored {self._size(rel)} bytes after the "
                                   f"upload of {entry.size}; the object store (or a proxy) lost "
                                   "part of it", url=f"{self.url}/{rel}")
            # stored with the next upload's journal write: lost in a crash, the object is only
            # sent again by the re-run (the pending entry already makes it ours to remove)
            self._note(rel, {"state": "done", "size": entry.size, "sha256": entry.sha256})
        if not keep:
            path.unlink()
        return entry

    def _retry(self, call: Any, rel: str, what: str) -> Any:
        """One storage call under feedpipe.storage's retry policy (typed error when spent)."""
        return with_retries(call, f"{self.url}/{rel}", what)

    def _size(self, rel: str) -> int | None:
        try:
            return int(self._retry(lambda: self.fs.info(self.key(rel))["size"], rel, "stat"))
        except FileNotFoundError:
            return None

    def _submit(self, path: Path) -> None:
        assert self._pool is not None
        self._queued.acquire()  # backpressure: the packer waits when uploads fall behind
        fut = self._pool.submit(self._upload, path)
        fut.add_done_callback(lambda _: self._queued.release())
        self._entries[path] = fut

    def after_write(self, root: Path, writer: DatasetWriter) -> None:
        """Upload every shard the writer has finished (all but the one it writes to)."""
        for name in getattr(writer, "shards", [])[:-1]:
            if root / name not in self._entries:
                self._submit(root / name)
        for fut in self._entries.values():  # a failed upload stops the conversion now
            if fut.done() and fut.exception() is not None:
                fut.result()

    def entry(self, root: Path, name: str) -> FileEntry:
        """The size and SHA-256 of a data file, uploading it now if it was not yet."""
        if root / name not in self._entries:
            self._submit(root / name)
        return self._entries[root / name].result()

    # --- the end --------------------------------------------------------------------------------

    def commit(self) -> None:
        """Upload the manifests last (the commit point), then remove the journaled objects the new
        manifests do not list, and the journal."""
        try:
            assert self._pool is not None
            self._pool.shutdown(wait=True)
            for fut in self._entries.values():
                fut.result()
            manifests = sorted(self.staging.rglob(MANIFEST_NAME))
            new = {self._rel(p) for p in manifests}
            for m in manifests:
                split = self._rel(m.parent) + "/" if m.parent != self.staging else ""
                new |= {split + str(f["name"]) for f in json.loads(m.read_text())["files"]}
            for m in manifests:
                self._upload(m, keep=True)
            stale = sorted(set(self.journal) - new)
            if stale:
                self.fs.rm([self.key(n) for n in stale])
            self.fs.rm_file(self.key(JOURNAL))
            shutil.rmtree(self.staging, ignore_errors=True)
        finally:
            self.lock.release()

    def abort(self) -> None:
        """Stop uploading; keep the uploaded objects and the journal (no manifest: nothing reads
        them as a dataset) for a re-run to resume; remove the staging folder."""
        try:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            shutil.rmtree(self.staging, ignore_errors=True)
        finally:
            self.lock.release()


def is_remote(out: str | os.PathLike[str]) -> bool:
    """True for an object-storage URL given as a str (feedpipe.storage.is_remote: an unknown
    scheme raises ConfigError); a pathlib.Path is never one."""
    return isinstance(out, str) and _is_remote(out)
