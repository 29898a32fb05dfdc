"""LMDB: one environment, zero-padded integer keys, one record per sample (see codecs.pack_record).

The key ``feedpipe.dataset_id`` holds the manifest's ``extra.dataset_id``; the reader compares
the two, and ``data.mdb``'s size, at open, so another dataset's ``data.mdb`` copied in is refused.
A merged dataset is its parts' environments (``extra.parts``) read as one.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Sequence

import lmdb
import numpy as np

from ...errors import CorruptRecordError, UnsafeDataError
from ...schema.codecs import pack_record, unpack_record
from ...schema.fields import Field
from ...schema.model import Schema
from ...system import block_sigint
from ..manifest import Manifest
from .base import (
    KEY_DIGITS,
    DatasetReader,
    DatasetWriter,
    Visitor,
    sample_key,
    unsafe_name,
)

# Small write transactions: LMDB copies a transaction's records into malloc'd dirty pages and
# frees them at commit, so a 64 MiB transaction made glibc return and re-fault 64 MiB each time
# (~11 page faults an image, a third of a passthrough conversion's system time;
# benchmarks/RESULTS.md section 3). 2 MiB ones stay in the retained heap (keep_freed_heap).
_FLUSH_BYTES = 2 << 20
_FLUSH_RECORDS = 2048
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)


def keep_freed_heap() -> None:
    """Ask glibc to keep up to 64 MiB of freed heap and serve blocks up to 32 MiB from it, not
    return memory at every free and fault it in again (a writer reallocates the same sizes all
    the time). Process-wide; a no-op off glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_TRIM_THRESHOLD, 64 << 20)
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
#: (pid, device, inode) of a data.mdb -> [its environment, the readers using it]: py-lmdb allows
#: one handle per data file and process, so the readers of one file share it; the last one to
#: go closes it (a replaced dataset's deleted data.mdb is unmapped, not kept until exit)
_ENVS: dict[tuple[int, int, int], list[Any]] = {}
_ENVS_LOCK = threading.RLock()  # re-entrant: a collected reader gives its envs back mid-open


def _give_back(pid: int, keys: list[tuple[int, int, int]]) -> None:
    """A reader's environments (``_ENVS`` keys), given back when it is closed or collected."""
    if pid != os.getpid():  # a forked child's copy: the parent's to give back
        return
    with _ENVS_LOCK:
        for key in keys:
            entry = _ENVS.get(key)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del _ENVS[key]
                    entry[0].close()


ID_KEY = b"feedpipe.dataset_id"  # sorts after every sample key: appended last


class LmdbWriter(DatasetWriter):
    """Writes records in batched transactions and grows ``map_size`` itself on MDB_MAP_FULL.

    Each transaction is committed on a helper thread while this one packs the next (py-lmdb
    releases the GIL in ``commit``, a third of a passthrough conversion's CPU time); one thread
    at a time uses a transaction. No LMDB lock file: the output's own lock keeps writers out.
    """

    format_name = "lmdb"

    def __init__(self, root: Path, schema: Schema, map_size: int = 1 << 30) -> None:
        super().__init__(root, schema)
        keep_freed_heap()
        # meminit: unused page space is zeroed, not stale heap bytes (reproducible data.mdb)
        self._env = lmdb.open(str(self.root), subdir=True, map_size=map_size, sync=False,
                              metasync=False, meminit=True, max_dbs=0, lock=False)
        self._pending: list[tuple[bytes, bytes]] = []
        self._id: str | None = None
        self._pending_bytes = 0
        # SIGINT blocked: Ctrl-C reaches the main thread only (the converter blocks it while its
        # worker pool starts)
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="feedpipe-writer",
                                             initializer=block_sigint)
        self._commit: Future[None] | None = None

    def _write(self, index: int, values: list[Any]) -> None:
        rec = pack_record([f.encode(v) for f, v in zip(self.schema, values, strict=True)])
        self.content.update(memoryview(rec)[: 8 + 8 * len(values)])  # lengths and crc32s
        self._pending.append((sample_key(index).encode(), rec))
        self._pending_bytes += len(rec)
        if self._pending_bytes >= _FLUSH_BYTES or len(self._pending) >= _FLUSH_RECORDS:
            self._flush()

    def _flush(self) -> None:
        """Put the pending records in a new transaction (after the last one is committed) and
        commit it on the helper thread."""
        self._wait()
        while self._pending:
            txn = self._env.begin(write=True)
            try:
                for key, value in self._pending:
                    txn.put(key, value, append=True)
            except lmdb.MapFullError:
                txn.abort()
                size = self._env.info()["map_size"]
                self._env.set_mapsize(max(2 * size, size + 4 * self._pending_bytes))
                continue
            except BaseException:
                txn.abort()
                raise
            self._pending.clear()
            self._pending_bytes = 0
            self._commit = self._committer.submit(txn.commit)

    def _wait(self) -> None:
        """Wait for the transaction being committed; its error, if any, is raised here."""
        job, self._commit = self._commit, None
        if job is not None:
            job.result()

    def close(self) -> tuple[list[str], dict[str, Any]]:
        if self._env is not None:
            try:
                self._id = self.dataset_id()
                self._pending.append((ID_KEY, self._id.encode()))
                self._flush()
                self._wait()
                self._env.sync(True)
            finally:
                self._committer.shutdown(wait=True)  # nothing uses the environment after this
                self._env.close()
                self._env = None
            (self.root / "lock.mdb").unlink(missing_ok=True)  # readers open with lock=False
        return ["data.mdb"], {"dataset_id": self._id}


class LmdbReader(DatasetReader):
    """Opens lazily per process (``readonly=True, lock=False``) and reads zero-copy buffers."""

    format_name = "lmdb"
    _handles = ("_envs", "_keys", "_use")
    _use: weakref.finalize | None

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest | None = None, *,
                 readahead: bool = True) -> None:
        super().__init__(root, manifest)
        self.readahead = readahead
        self._fields = list(self.schema)
        self._files, self._ids, self._ends = self.parts("data.mdb")
        self._dirs = [(self.root / f).parent for f in self._files]  # checked by the manifest

    def _open(self) -> None:
        if self._use is not None:  # a forked child's copy (gives nothing back there)
            self._use()
        self._keys: list[tuple[int, int, int]] = []
        self._use = weakref.finalize(self, _give_back, os.getpid(), self._keys)
        self._use.atexit = False
        self._envs = [self._open_env(d, name, id_)
                      for d, name, id_ in zip(self._dirs, self._files, self._ids, strict=True)]

    def _open_env(self, root: Path, name: str, dataset_id: object) -> lmdb.Environment:
        # py-lmdb allows one handle per data file and process: readers of the same file share it
        # (the first one's readahead applies). Keyed by the file's identity, not its path, so a
        # re-converted directory is a new environment.
        st = os.stat(root / "data.mdb")
        self.check_size(name, st.st_size)
        key = (os.getpid(), st.st_dev, st.st_ino)
        with _ENVS_LOCK:
            env = self._shared_env(root, key, st.st_size)
            self._keys.append(key)
        try:
            with env.begin() as txn:
                found = txn.get(ID_KEY)
        except lmdb.Error as exc:
            raise CorruptRecordError(f"{root / 'data.mdb'}: damaged ({exc}); re-convert the "
                                     "dataset", dataset=self.root) from exc
        self.check_id(name, found, dataset_id)
        return env

    def _shared_env(self, root: Path, key: tuple[int, int, int], size: int) -> lmdb.Environment:
        """The process's environment of ``root``, opened if none is, with one more user
        counted; under _ENVS_LOCK."""
        for stale in [k for k in _ENVS if k[0] != key[0]]:  # inherited through fork: unusable
            _ENVS.pop(stale)[0].close()
        entry = _ENVS.get(key)
        if entry is not None:  # counted at once: a collected reader giving it back (a garbage
            entry[1] += 1      # collection may run at any allocation) leaves it to us
            return entry[0]
        try:
            env = lmdb.open(str(root), subdir=True, readonly=True, lock=False,
                            readahead=self.readahead, meminit=False, max_readers=512)
        except lmdb.Error as exc:
            raise CorruptRecordError(f"{root / 'data.mdb'}: not a readable LMDB "
                                     f"environment ({exc}); the dataset is damaged: "
                                     "re-convert it", dataset=self.root) from exc
        info, psize = env.info(), env.stat()["psize"]
        need = (info["last_pgno"] + 1) * psize
        if size < need:  # reading a page past the end would kill us with SIGBUS
            env.close()
            raise CorruptRecordError(f"{root / 'data.mdb'}: truncated ({size} "
                                     f"bytes, its pages need {need}); the dataset is "
                                     "damaged: re-convert it", dataset=self.root)
        _ENVS[key] = [env, 1]
        return env

    def _visit(self, indices: Sequence[int], fn: Visitor, fields: list[Field]) -> None:
        nfields, version, names = len(self._fields), self.manifest.format_version, self.schema.names
        wanted = [(self._fields.index(f), f) for f in fields]
        check = [j for j, _ in wanted]  # crc32 of the fields read, not of the whole record
        single = len(self._envs) == 1
        part = [0] * len(indices) if single else \
            np.searchsorted(self._ends, indices, side="right").tolist()
        with ExitStack() as stack:
            txns: dict[int, Any] = {}
            for pos, i in enumerate(indices):
                j = part[pos]
                txn = txns.get(j)
                if txn is None:  # one read transaction per environment and batch
                    txn = txns[j] = stack.enter_context(self._envs[j].begin(buffers=True))
                try:  # error context is formatted only on failure: this loop is the hot path
                    buf = txn.get(sample_key(i if single else
                                             i - int(self._ends[j - 1] if j else 0)).encode())
                    if buf is None:
                        raise self.corrupt(i, "record missing from LMDB")
                    payloads = unpack_record(buf, nfields, "record", version=version,
                                             check=check, names=names)
                    stored = {f.name: f.decode(payloads[j], f.name) for j, f in wanted}
                except UnsafeDataError as exc:  # keep the type: callers refuse, not skip
                    raise self.unsafe(i, exc) from exc
                except CorruptRecordError as exc:
                    if hasattr(exc, "index"):
                        raise
                    raise self.corrupt(i, str(exc)) from exc
                except Exception as exc:  # lmdb.Error: a damaged page or tree
                    raise self.corrupt(i, f"undecodable record: {exc!r}") from exc
                fn(pos, stored)

    def num_entries(self) -> int:
        """Entries actually in the environment (``feedpipe verify`` compares with the manifest)."""
        self._ensure_open()
        total = 0
        for d, env in zip(self._dirs, self._envs, strict=True):
            try:
                with env.begin() as txn:  # the dataset id is no record
                    total += int(env.stat()["entries"]) - (txn.get(ID_KEY) is not None)
            except lmdb.Error as exc:
                raise CorruptRecordError(f"{d / 'data.mdb'}: damaged ({exc})",
                                         dataset=self.root) from exc
        return total

    def stray_entries(self) -> list[str]:
        self._ensure_open()
        out: list[str] = []
        sizes = np.diff(self._ends, prepend=0).tolist()
        for d, env, n in zip(self._dirs, self._envs, sizes, strict=True):
            try:
                with env.begin() as txn:
                    for key in txn.cursor().iternext(values=False):
                        if key == ID_KEY:
                            continue
                        k = bytes(key).decode("latin1")
                        if not (len(k) == KEY_DIGITS and k.isdigit() and int(k) < n):
                            out.append(f"{d} (lmdb): entry {k!r} belongs to no sample"
                                       + (" (a pickle: never read)" if unsafe_name(k) else ""))
            except lmdb.Error as exc:
                out.append(f"{d / 'data.mdb'}: damaged B-tree ({exc})")
        return out

    def close(self) -> None:
        self._envs = None
        if self._use is not None:  # closed once no other reader of these files uses them
            self._use()
        self._use = None
        super().close()
