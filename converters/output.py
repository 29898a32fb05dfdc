"""Where a conversion writes: output checks, the output lock, the partial directory, the swap.

A destructive step only ever touches what feedpipe made: ``--overwrite`` replaces a feedpipe
dataset (or a train/val split of them) and nothing else, never the source, and a leftover
``.<out>.partial`` / ``.<out>.old`` is removed only when it holds feedpipe's marker or files its
manifest lists. An ``fcntl.flock`` on ``.<out>.lock`` keeps two conversions of one output apart;
the kernel drops it when the holder dies, so a killed run never blocks the next one.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import resource
import shutil
import stat
from pathlib import Path
from typing import Any, Callable, Iterable, NoReturn, Protocol

from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry
from feedpipe.dataset.registry import DatasetWriter
from feedpipe.errors import (
    DiskFullError,
    NothingConvertedError,
    OutputBusyError,
    OutputRefusedError,
)

from .sources import Source

MARKER = ".feedpipe-partial"  # written first into every partial directory, removed before the swap
_OURS = frozenset({MANIFEST_NAME, MANIFEST_NAME + ".tmp", "lock.mdb", MARKER})
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_FULL_TEXT = tuple(os.strerror(e) for e in _FULL)


def _shown(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" ... ({len(names)} in all)" if len(names) > n else "")


# --- what may be replaced -----------------------------------------------------------------------

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
        return [f"{n}/{e}" for n, p in zip(names, parts) for e in p or []]
    listed = _manifest_files(path)
    if listed is None:
        return None
    return [n for n in names if n not in _OURS | listed]


def _manifest_files(path: Path) -> set[str] | None:
    """The file names a feedpipe manifest (finished or its temp file) lists; None without one."""
    for name in (MANIFEST_NAME, MANIFEST_NAME + ".tmp"):
        try:
            d = json.loads((path / name).read_text(encoding="utf-8"))
            if "feedpipe_manifest" not in d:
                return None
            theirs = set(d.get("extra", {}).get("foreign_files", []))  # indexed in place
            return {str(f["name"]) for f in d["files"]} - theirs
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return None


def _refuse_unless_ours(path: Path, what: str) -> None:
    if path.is_symlink() or not path.is_dir():
        kind = "a symlink" if path.is_symlink() else "a file"
        raise OutputRefusedError(f"{path}: {what} is {kind}, not a feedpipe dataset; refusing to "
                                 "replace it. Choose another -o or remove it yourself.")
    foreign = foreign_entries(path)
    if foreign is None:
        held = _shown(sorted(os.listdir(path)))
        raise OutputRefusedError(
            f"{path}: {what} is not a feedpipe dataset (it holds {held}); --overwrite only "
            "replaces a dataset feedpipe wrote. Choose another -o or remove it yourself.")
    if foreign:
        raise OutputRefusedError(f"{path}: {what} is a feedpipe dataset but also holds files "
                                 f"feedpipe did not make ({_shown(foreign)}); move them out first.")


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
            raise OutputRefusedError(f"{out}: the output is or contains {root}, the folder of "
                                     "the source manifest. Choose an -o outside it.")
    for t in sorted(trees):
        if _inside(o, t):
            rel = "is" if o == t else "lies inside"
            raise OutputRefusedError(f"{out}: the output {rel} the source {t}; writing there "
                                     "would mix the dataset into (or delete) your images. Choose "
                                     "an -o outside the source.")
        if _inside(t, o):
            raise OutputRefusedError(f"{out}: the output contains the source {t}; --overwrite "
                                     "would delete your images. Choose an -o outside the source.")


# --- the lock, the partial directory and the swap -----------------------------------------------

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
        while self.fd is None:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                raise OutputBusyError(
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
                _check_full(exc, self.out, f"cannot write the lock file {self.path}")
                raise

    def _open(self) -> int:
        """The lock file, never through a symlink (the folder is the user's: a planted
        ``.<out>.lock`` link would have its target truncated) and only a plain file."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                         | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OutputRefusedError(f"{self.path}: the lock file is a symlink; feedpipe never "
                                         "writes through one (it may lead outside the folder). "
                                         "Remove it and run again.") from exc
            _check_full(exc, self.out, f"cannot make the lock file {self.path}")
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise OutputRefusedError(f"{self.path}: the lock file is not a plain file (a FIFO, a "
                                     "device or a hard link to another file); remove it and run "
                                     "again.")
        return fd

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # while still holding it (see the class docstring)
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


class Output:
    """One conversion's output: ``claim()`` checks and locks it and makes the partial directory,
    then ``commit()`` swaps the finished partial into place or ``abort()`` removes it."""

    def __init__(self, out: Path, overwrite: bool) -> None:
        self.out, self.overwrite = out, overwrite
        self.partial = out.parent / f".{out.name}.partial"
        self.old = out.parent / f".{out.name}.old"  # left by the non-atomic fallback swap
        self.lock = OutputLock(out)

    def claim(self, source: Source | None) -> Path:
        """Check, lock and make the partial directory; ``source`` None: data from memory (no
        source tree for the output to stay out of)."""
        if source is not None:
            check_not_source(source, self.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
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
            _check_full(exc, self.out, "cannot start the output")
            raise
        return self.partial

    def after_write(self, root: Path, writer: DatasetWriter) -> None:
        """Nothing to do locally (a remote output uploads finished shards here)."""

    def entry(self, root: Path, name: str) -> FileEntry:
        """A data file's size and SHA-256 for the manifest."""
        return FileEntry.of(root, name)

    def abort(self) -> None:
        try:
            shutil.rmtree(self.partial, ignore_errors=True)
        finally:
            self.lock.release()

    def commit(self) -> None:
        """Atomically replace the output (``renameat2(RENAME_EXCHANGE)``: a reader sees the old
        dataset or the new one), then remove the old one; release the lock."""
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


# --- failures worth a clear message -------------------------------------------------------------

class _Abortable(Protocol):
    def abort(self) -> None: ...


def abandon(exc: BaseException, writers: Iterable[DatasetWriter], output: _Abortable,
            out: Path, partial: Path) -> NoReturn:
    """After a failed conversion: close the writers (a failed close loses to ``exc``), remove the
    partial output, and raise: :class:`DiskFullError` (from ``exc``) when the disk filled, else
    ``exc`` itself."""
    for writer in writers:
        try:
            writer.close()
        except Exception:  # the original error matters more than a failed cleanup
            pass
    full = disk_full(exc, out, partial)
    output.abort()
    if full is None:
        raise exc
    raise full from exc


def _check_full(exc: BaseException, out: Path, what: str) -> None:
    """Raise :class:`DiskFullError` naming ``out`` if ``exc`` is a full disk or quota."""
    if isinstance(exc, OSError) and exc.errno in _FULL:
        raise DiskFullError(f"{out}: the output's filesystem is full ({what}: {exc.strerror}); "
                            "nothing was changed. Free space, or choose another output.") from exc


def disk_full(exc: BaseException, out: Path, partial: Path) -> DiskFullError | None:
    """A typed error if ``exc`` comes from a full disk, quota or file-size limit.

    Call it before removing ``partial``: LMDB reports a failed page write as EIO, so when the error
    carries no errno of its own, the partial output's filesystem and sizes are checked instead.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if (isinstance(seen, OSError) and seen.errno in _FULL) or \
                any(t in str(seen) for t in _FULL_TEXT):
            break
        seen = seen.__cause__ or seen.__context__
    vague = type(exc).__module__ == "lmdb" or (isinstance(exc, OSError) and
                                                exc.errno in (None, errno.EIO))
    if seen is None and vague and _exhausted(partial):
        seen = exc
    if seen is None:
        return None
    return DiskFullError(f"{out}: the output's filesystem is full or a file size limit was hit "
                         f"({seen}); the partial output was removed and nothing else was "
                         "changed. Free space or choose another -o.")


def _exhausted(partial: Path) -> bool:
    """Less than 1 MiB free where ``partial`` lives, or a file in it at the RLIMIT_FSIZE limit."""
    try:
        st = os.statvfs(partial)
        if st.f_bavail * st.f_frsize < 1 << 20:
            return True
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        return limit != resource.RLIM_INFINITY and any(
            p.stat().st_size >= limit - (64 << 10) for p in partial.rglob("*") if p.is_file())
    except OSError:
        return False


def empty_result(where: str, counts: dict[str, int], skipped: list[dict[str, Any]],
                 why: Callable[[list[dict[str, Any]]], str]) -> NothingConvertedError | None:
    """Zero samples written (or an empty train/val split) is an error that says why: ``why``
    tells it from the skip list (:func:`why_empty` for a folder or manifest source)."""
    total = sum(counts.values())
    if total and all(counts.values()):
        return None
    if total:
        empty = [k for k, v in counts.items() if not v]
        return NothingConvertedError(f"the {empty[0]} split got 0 of {total} samples: raise "
                                     "--val-fraction, or leave it out for a single dataset")
    return NothingConvertedError(f"{where}: wrote 0 samples: {why(skipped)}")


def why_empty(source: Source, skipped: list[dict[str, Any]]) -> str:
    """Why a folder or manifest source gave no sample: missing paths, skips, or what it holds."""
    if source.items:
        missing = [i.rel for i in source.items if not i.path.exists()]
        if missing:
            return (f"{len(missing)} of {len(source.items)} listed paths do not exist (relative "
                    f"to {source.root}): {_shown(missing, 3)}")
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
        return (f"{root} is already a packed dataset ({_shown(sorted(names))}); open it with "
                "feedpipe.open_dataset / `feedpipe info`, or convert the original images")
    tars = [f for f in files if f.lower().endswith(".tar")]
    if tars:
        return (f"{root} holds {len(tars)} .tar files ({_shown(tars, 3)}): looks like WebDataset "
                f"shards; `feedpipe convert {root}` packs them, or from Python "
                "converters.convert(converters.foreign_wds.source([DIR]), ...); "
                "`feedpipe index` reads them in place")
    if files:
        return f"no image files found ({len(files)} other files, e.g. {_shown(files, 3)})"
    return "the source holds no files"
