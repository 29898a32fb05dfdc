"""A conversion into object storage: the manifest, uploaded last, is the commit point
(docs/remote.md); finished shards are uploaded as the writer moves on, so local disk holds a few.
An upload journal records each object before and after its upload: a re-run skips what is done,
and only what the journal or the old manifest lists is ever removed."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry
from feedpipe.dataset.registry import DatasetWriter
from feedpipe.errors import BadInputError, ConfigError, RemoteNotFoundError, StorageError
from feedpipe.paths import cache_dir
from feedpipe.storage.store import UrlStore

from .sources import Source
from .swap import OutputLock, shown

log = logging.getLogger(__name__)

JOURNAL = ".feedpipe-upload.json"
SPLITS = ("", "train/", "val/")  # where a conversion's manifests lie, relative to the URL
READ_ONLY = ("http://", "https://")
UPLOAD_THREADS = 4  # uploads at once: a store answers each PUT at its own pace
MAX_QUEUED = 4  # staged shards waiting for upload before the packer waits (bounds local disk)


class ManifestCommit:
    """The object-store commit policy (the module docstring); ``abort()`` keeps what was uploaded
    (journaled) for a re-run."""

    def __init__(self, store: UrlStore, overwrite: bool) -> None:
        self.store, self.url, self.overwrite = store, store.url, overwrite
        if self.url.lower().startswith(READ_ONLY):
            raise ConfigError(f"{self.url}: feedpipe reads datasets over http(s) but cannot write "
                              "there; convert to an object store (s3://, gs://...) or a local "
                              "folder and serve that")
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.staging = cache_dir() / "staging" / digest
        self.lock = OutputLock(self.staging)  # two conversions of one URL on this machine
        self.journal: dict[str, dict[str, Any]] = {}
        self._jlock = threading.RLock()  # the journal in memory
        self._put_lock = threading.Lock()  # one journal PUT at a time
        self._version = self._stored = 0  # journal versions: the newest, the newest stored
        self._uploads: dict[Path, Future[FileEntry]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._queued = threading.BoundedSemaphore(MAX_QUEUED)

    def claim(self, source: Source | None) -> Path:
        """Check what the URL holds (only what feedpipe made), lock, make the staging folder."""
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
        held = self.store.names()
        if not held and not self.store.bucket_exists():
            bucket = "/".join(self.url.split("/")[:3])  # scheme://bucket
            raise RemoteNotFoundError(f"{bucket}: no such bucket; create it, or check "
                                      f"its name and the endpoint, before writing {self.url}",
                                      url=self.url)
        self.journal = dict(((self._read_json(JOURNAL) if JOURNAL in held else None) or {})
                            .get("files", {}))
        manifests = {s + MANIFEST_NAME: self._read_json(s + MANIFEST_NAME)
                     for s in SPLITS if s + MANIFEST_NAME in held}
        old: set[str] = set()  # the old dataset's objects, its manifests included
        for name, m in manifests.items():
            if m is None or "feedpipe_manifest" not in m:
                raise BadInputError(f"{self.store.where(name)}: not a feedpipe manifest; "
                                    "refusing to write over it. Choose another -o or remove "
                                    "it yourself.")
            split = name[:-len(MANIFEST_NAME)]
            old |= {name, *(split + str(f["name"]) for f in m.get("files", []))}
        foreign = sorted(held - old - {JOURNAL, *self.journal})
        if foreign:
            raise BadInputError(f"{self.url}: holds objects feedpipe did not make "
                                f"({shown(foreign)}); choose another -o, or move them out "
                                "first")
        if manifests and not self.overwrite:
            raise FileExistsError(f"{self.url} holds a dataset ({shown(sorted(manifests))}); "
                                  "pass overwrite=True (--overwrite) to replace it")
        if manifests:  # the old dataset's objects become ours to remove, then it is uncommitted
            for rel in old:
                self.journal.setdefault(rel, {"state": "old"})
            self._save_journal()
            self.store.remove(manifests)
        elif self.journal:
            log.info("%s: resuming an unfinished conversion (%d objects journaled)", self.url,
                     len(self.journal))

    def _read_json(self, rel: str) -> dict[str, Any] | None:
        try:
            d = json.loads(self.store.read_bytes(rel))
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
        """Store a journal at least as new as ``version`` (None: the state now), one PUT at a time
        of the newest state, so an older copy never lands after a newer one."""
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
            self.store.write(JOURNAL, lambda fh: fh.write(body.encode()))
            self._stored = current

    def _upload(self, path: Path) -> Future[FileEntry]:
        """``path``'s upload, started unless it was already."""
        if path not in self._uploads:
            assert self._pool is not None
            self._queued.acquire()  # backpressure: the packer waits when uploads fall behind
            self._uploads[path] = self._pool.submit(self.publish, path)
            self._uploads[path].add_done_callback(lambda _: self._queued.release())
        return self._uploads[path]

    def after_write(self, root: Path, writer: DatasetWriter) -> None:
        """Upload the shards the writer has finished; a failed upload stops the conversion now."""
        for name in getattr(writer, "shards", [])[:-1]:
            self._upload(root / name)
        for fut in self._uploads.values():
            if fut.done() and fut.exception() is not None:
                fut.result()

    def entry(self, root: Path, name: str) -> FileEntry:
        """A closed data file's size and SHA-256 for the manifest, once it is uploaded."""
        return self._upload(root / name).result()

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.staging).as_posix()

    def publish(self, path: Path, keep: bool = False) -> FileEntry:
        """Upload one staged file unless a re-run finds it there already; journaled both ways."""
        rel = self._rel(path)
        entry = FileEntry.of(path.parent, path.name)
        done = self.journal.get(rel, {})
        if not (done.get("state") == "done" and done.get("sha256") == entry.sha256 and
                self._size(rel) == entry.size):  # else uploaded by an interrupted run
            self._save_journal(self._note(rel, {"state": "pending"}))  # stored before the upload
            self.store.put(rel, path)
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

    def _size(self, rel: str) -> int | None:
        try:
            return self.store.size(rel)
        except FileNotFoundError:
            return None

    def commit(self) -> None:
        """Upload the manifests last, then remove the journaled objects they do not list."""
        try:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            for fut in self._uploads.values():
                fut.result()
            new = set()
            for m in sorted(self.staging.rglob(MANIFEST_NAME)):
                split = self._rel(m.parent) + "/" if m.parent != self.staging else ""
                new |= {self._rel(m), *(split + str(f["name"])
                                        for f in json.loads(m.read_text())["files"])}
                self.publish(m, keep=True)
            self.store.remove(sorted(set(self.journal) - new))
            self.store.remove([JOURNAL])
            shutil.rmtree(self.staging, ignore_errors=True)
        finally:
            self.lock.release()

    def abort(self) -> None:
        """Stop uploading; keep the uploads and the journal (no manifest: not a dataset) for a
        re-run."""
        try:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            shutil.rmtree(self.staging, ignore_errors=True)
        finally:
            self.lock.release()
