"""Where a conversion writes: the commit policy of its output (:func:`open_output`: a folder's
:class:`~converters.swap.SwapCommit` or an object store's
:class:`~converters.upload.ManifestCommit`), and the failures worth a clear message."""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import suppress
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NoReturn

from feedpipe.dataset.manifest import MANIFEST_NAME
from feedpipe.dataset.registry import DatasetWriter
from feedpipe.errors import BadInputError, ResourceError
from feedpipe.storage.store import UrlStore, open_store
from feedpipe.storage.store import is_remote as _is_remote
from feedpipe.system import file_size_limit

from .sources import Source
from .swap import FULL, SwapCommit, shown
from .upload import ManifestCommit

_FULL_TEXT = tuple(os.strerror(e) for e in FULL)


def is_remote(out: str | os.PathLike[str]) -> bool:
    """True for an object-storage URL given as a str (feedpipe.storage.is_remote: an unknown
    scheme raises ConfigError); a pathlib.Path is never one."""
    return isinstance(out, str) and _is_remote(out)


def open_output(out: str | Path, overwrite: bool, storage_options: Mapping[str, Any] | None
                ) -> SwapCommit | ManifestCommit:
    """The commit policy of ``out`` (a folder or an object-store URL)."""
    store = open_store(out if is_remote(out) else Path(out), storage_options)
    if isinstance(store, UrlStore):
        return ManifestCommit(store, overwrite)
    return SwapCommit(store, overwrite)


def abandon(exc: BaseException, writers: Iterable[DatasetWriter],
            output: SwapCommit | ManifestCommit, out: Path, partial: Path) -> NoReturn:
    """After a failed conversion: discard the writers (a failed one loses to ``exc``), remove the
    partial output, and raise: :class:`ResourceError` (from ``exc``) when the disk filled, else
    ``exc`` itself."""
    for writer in writers:
        with suppress(Exception):  # the original error matters more than a failed cleanup
            writer.discard()
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
    files = [p.relative_to(root).as_posix()
             for p in islice((p for p in root.rglob("*") if p.is_file()), 10_000)]
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
