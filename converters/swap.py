"""A local conversion's commit: the ``.<out>.partial`` folder, the output lock, the swap. A
destructive step only touches what feedpipe made (a dataset, or a leftover holding its marker or
files its manifest lists); the lock on ``.<out>.lock`` is dropped by the system when its holder
dies, so a killed run never blocks the next."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry
from feedpipe.errors import BadInputError, ResourceError
from feedpipe.storage.store import DirStore
from feedpipe.system import try_lock

from .sources import Source

MARKER = ".feedpipe-partial"  # written first into every partial directory, removed before the swap
_OURS = frozenset({MANIFEST_NAME, MANIFEST_NAME + ".tmp", "lock.mdb", MARKER})
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def shown(names: list[str], n: int = 5) -> str:
    """At most ``n`` names for a message, and how many there are in all."""
    return ", ".join(names[:n]) + (f" ... ({len(names)} in all)" if len(names) > n else "")


def foreign_entries(path: Path) -> list[str] | None:
    """Names in ``path`` that feedpipe did not make: [] for a feedpipe dataset (complete, partial
    with the marker, a train/val split, or an empty folder); None when it is not one at all."""
    names = sorted(os.listdir(path))
    if not names or MARKER in names:
        return []
    if set(names) <= {"train", "val", "test"}:
        parts = [foreign_entries(path / n) if (path / n).is_dir() and not (path / n).is_symlink()
                 else None for n in names]
        if any(p is None for p in parts):
            return None
        return [f"{n}/{e}" for n, p in zip(names, parts, strict=True) for e in p or []]
    for name in (MANIFEST_NAME, MANIFEST_NAME + ".tmp"):  # the files its manifest lists
        try:
            d = json.loads((path / name).read_text(encoding="utf-8"))
            theirs = set(d.get("extra", {}).get("foreign_files", []))  # indexed in place
            listed = {str(f["name"]) for f in d["files"]} - theirs
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if "feedpipe_manifest" not in d:
            return None
        return [n for n in names if n not in _OURS | listed]
    return None


def _refuse_unless_ours(path: Path, what: str) -> None:
    if path.is_symlink() or not path.is_dir():
        kind = "a symlink" if path.is_symlink() else "a file"
        raise BadInputError(f"{path}: {what} is {kind}, not a feedpipe dataset; refusing to "
                            "replace it. Choose another -o or remove it yourself.")
    foreign = foreign_entries(path)
    if foreign is None:
        held = shown(sorted(os.listdir(path)))
        raise BadInputError(
            f"{path}: {what} is not a feedpipe dataset (it holds {held}); --overwrite only "
            "replaces a dataset feedpipe wrote. Choose another -o or remove it yourself.")
    if foreign:
        raise BadInputError(f"{path}: {what} is a feedpipe dataset but also holds files "
                            f"feedpipe did not make ({shown(foreign)}); move them out first.")


def check_not_source(source: Source, out: Path) -> None:
    """Refuse an output that is, contains or lies inside the source (symlinks resolved): a folder
    source's tree; for a manifest, every folder holding a listed image, and the manifest's own
    folder may not be the output or inside it."""
    o = Path(os.path.realpath(out))
    root = Path(os.path.realpath(source.root))
    trees = {root}
    if source.kind == "manifest":
        trees = {Path(os.path.realpath(d)) for d in {i.path.parent for i in source.items}}
        if root.is_relative_to(o):
            raise BadInputError(f"{out}: the output is or contains {root}, the folder of "
                                     "the source manifest. Choose an -o outside it.")
    for t in sorted(trees):
        if o.is_relative_to(t):
            rel = "is" if o == t else "lies inside"
            raise BadInputError(f"{out}: the output {rel} the source {t}; writing there "
                                     "would mix the dataset into (or delete) your images. Choose "
                                     "an -o outside the source.")
        if t.is_relative_to(o):
            raise BadInputError(f"{out}: the output contains the source {t}; --overwrite "
                                     "would delete your images. Choose an -o outside the source.")


class OutputLock:
    """An exclusive ``flock`` on ``.<out>.lock`` beside the output, refused at once when held.

    The file is removed on release; a process that locked a file removed meanwhile retries, so
    two holders can never coexist.
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = out.parent / f".{out.name}.lock"
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while self.fd is None:
            fd = self._open()
            if not try_lock(fd):
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                raise ResourceError(
                    f"{self.out}: another feedpipe convert"
                    + (f" (pid {holder})" if holder.isdigit() else "")
                    + " is writing this output; wait for it to finish or choose another -o"
                ) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:  # released and removed while we waited for it: lock the new file
                os.close(fd)
                continue
            self.fd = fd
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError as exc:
                self.release()
                check_full(exc, self.out, f"cannot write the lock file {self.path}")
                raise

    def _open(self) -> int:
        """The lock file, never through a symlink (the folder is the user's: a planted
        ``.<out>.lock`` link would have its target truncated) and only a plain file."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                         | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BadInputError(f"{self.path}: the lock file is a symlink; feedpipe never "
                                    "writes through one (it may lead outside the folder). "
                                    "Remove it and run again.") from exc
            check_full(exc, self.out, f"cannot make the lock file {self.path}")
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise BadInputError(f"{self.path}: the lock file is not a plain file (a FIFO, a "
                                "device or a hard link to another file); remove it and run "
                                "again.")
        return fd

    def release(self) -> None:
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)  # while still holding it (see the class docstring)
        os.close(self.fd)
        self.fd = None


def check_full(exc: BaseException, out: Path, what: str) -> None:
    """Raise :class:`ResourceError` naming ``out`` if ``exc`` is a full disk or quota."""
    if isinstance(exc, OSError) and exc.errno in FULL:
        raise ResourceError(f"{out}: the output's filesystem is full ({what}: {exc.strerror}); "
                            "nothing was changed. Free space, or choose another output.",
                            errno=exc.errno) from exc


class SwapCommit:
    """A local folder's commit policy: ``claim()`` checks and locks the output and makes
    ``.<out>.partial``, where each file is final as written (``entry()``: its size and SHA-256);
    ``commit()`` swaps the folder into place, ``abort()`` removes it; both release the lock."""

    def __init__(self, store: DirStore, overwrite: bool) -> None:
        self.out, self.overwrite = store.root, overwrite
        self.partial = self.out.parent / f".{self.out.name}.partial"
        self.old = self.out.parent / f".{self.out.name}.old"  # left by the non-atomic fallback
        self.lock = OutputLock(self.out)

    def claim(self, source: Source | None) -> Path:
        """Refuse to replace what feedpipe did not make (or the ``source``), lock, clear a killed
        run's leftovers and make the partial directory."""
        if source is not None:
            check_not_source(source, self.out)
        self.lock.acquire()
        made = False
        try:
            exists = self.out.exists() or self.out.is_symlink()
            if exists and not self.overwrite:
                raise FileExistsError(f"{self.out} exists; pass overwrite=True (--overwrite) to "
                                      "replace it")
            if exists:
                _refuse_unless_ours(self.out, "the output")
            for leftover in (self.partial, self.old):
                if leftover.exists() or leftover.is_symlink():  # left by a killed run
                    _refuse_unless_ours(leftover, "a leftover of an earlier conversion")
                    shutil.rmtree(leftover)
            self.partial.mkdir()
            made = True
            (self.partial / MARKER).write_text(json.dumps({"output": self.out.name,
                                                           "pid": os.getpid()}) + "\n")
        except BaseException as exc:
            if made:
                shutil.rmtree(self.partial, ignore_errors=True)
            self.lock.release()
            check_full(exc, self.out, "cannot start the output")
            raise
        return self.partial

    def after_write(self, root: Path, writer: Any) -> None:
        """Nothing is published before the commit."""

    def entry(self, root: Path, name: str) -> FileEntry:
        return FileEntry.of(root, name)

    def commit(self) -> None:
        """Atomically replace the output (``renameat2(RENAME_EXCHANGE)``: a reader sees the old
        dataset or the new one), then remove the old one."""
        try:
            (self.partial / MARKER).unlink()
            fsync_dir(self.partial)
            if not self.out.exists():
                os.rename(self.partial, self.out)
            elif exchange(self.partial, self.out):
                shutil.rmtree(self.partial)  # now the old dataset
            else:
                os.rename(self.out, self.old)
                os.rename(self.partial, self.out)
                shutil.rmtree(self.old)
            fsync_dir(self.out.parent)
        finally:
            self.lock.release()

    def abort(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)
        self.lock.release()


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False where the system cannot."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
