"""The writing half of every conversion, whatever the source: write each split's :class:`Sample`
objects in order, name the skipped ones, refuse an empty result, write the manifests and commit
through the output's policy (a folder's :class:`~converters.swap.SwapCommit` or an object store's
:class:`~converters.upload.ManifestCommit`), or remove the partial output on any failure."""

from __future__ import annotations

import errno
import os
import shutil
import time
from contextlib import suppress
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NoReturn

import numpy as np

from feedpipe.dataset.formats.base import sample_key
from feedpipe.dataset.manifest import MANIFEST_NAME, Manifest
from feedpipe.dataset.registry import WRITERS, DatasetWriter
from feedpipe.errors import BadInputError, ConfigError, ResourceError
from feedpipe.storage.store import UrlStore, is_remote, open_store
from feedpipe.system import file_size_limit

from .result import ConvertResult, Stored
from .sources import Source
from .swap import FULL, SwapCommit, shown
from .upload import ManifestCommit

_FULL_TEXT = tuple(os.strerror(e) for e in FULL)


def open_output(out: str | Path, overwrite: bool, storage_options: Mapping[str, Any] | None
                ) -> SwapCommit | ManifestCommit:
    """The commit policy of ``out`` (a folder or an object-store URL)."""
    store = open_store(out if is_remote(out) else Path(out), storage_options)
    if isinstance(store, UrlStore):
        return ManifestCommit(store, overwrite)
    return SwapCommit(store, overwrite)


def abandon(exc: BaseException, writers: Iterable[DatasetWriter],
            output: SwapCommit | ManifestCommit, out: Path, partial: Path) -> NoReturn:
    """After a failed conversion: discard the writers, remove the partial output, and raise
    ``exc``, or a ResourceError from it when the disk filled."""
    for writer in writers:
        with suppress(Exception):  # the original error matters more than a failed cleanup
            writer.discard()
    full = disk_full(exc, out, partial)
    output.abort()
    if full is None:
        raise exc
    raise full from exc


def disk_full(exc: BaseException, out: Path, partial: Path) -> ResourceError | None:
    """A typed error if ``exc`` comes from a full disk, quota or file-size limit. Call it before
    removing ``partial``: for an error without an errno (LMDB's EIO) its filesystem tells."""
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


Progress = Callable[[int, int], None]


@dataclass
class Sample:
    """One input's outcome: its values to write into ``split``, or None and why it is skipped;
    ``shown`` names it in a strict error, ``stored`` is counted once it is written."""

    name: str
    split: str
    values: dict[str, Any] | None
    why: str = ""
    shown: str = ""
    stored: Stored | None = None


@dataclass
class PackTarget:
    """Where and how a conversion writes: the output, the format and the run's policies."""

    out: str | Path
    to: str
    overwrite: bool = False
    storage_options: Mapping[str, Any] | None = None
    writer_options: dict[str, Any] | None = None
    strict: bool = False
    progress: Progress | None = None
    key0: int | None = None  # a WebDataset part's first key (keys stay unique once merged)
    # a value its field cannot hold skips the sample, named (records carry values as given);
    # False: it raises (image files: the values are the converter's own)
    skip_bad_values: bool = False
    t0: float = field(default_factory=time.perf_counter)  # when the conversion started

    def __post_init__(self) -> None:
        if self.to not in WRITERS:
            raise ConfigError(f"to={self.to!r}: use one of {sorted(WRITERS)}", option="to")
        if not is_remote(self.out):
            self.out = Path(self.out)


def split_indices(n: int, val_fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of validation items: a seeded permutation, deterministic for (n, seed)."""
    mask = np.zeros(n, dtype=bool)
    mask[np.random.default_rng(seed).permutation(n)[:round(n * val_fraction)]] = True
    return mask


#: (what to write for each split, the schema) once every sample is written: the manifest's
#: ``conversion`` (without ``split``) and the schema, settled from what was written
Finish = Callable[[dict[str, list[dict[str, str]]]], tuple[dict[str, Any], Any]]


def write_samples(target: PackTarget, result: ConvertResult, *, claim: Source | None,
                  split_names: Iterable[str], schema: Any, classes: tuple[str, ...],
                  samples: Iterable[Sample], total: int, finish: Finish, where: str,
                  why_empty: Callable[[list[dict[str, str]]], str]) -> ConvertResult:
    """Write ``samples`` into one writer per split (``""``: the output itself) and commit;
    ``claim``: the source the output must stay out of; ``where`` and ``why_empty``: for no sample."""
    output = open_output(target.out, target.overwrite, target.storage_options)
    tmp = output.claim(claim)
    names = list(split_names)
    splits = {n: (tmp / n if n else tmp) for n in names}
    writers: dict[str, DatasetWriter] = {}
    skipped: dict[str, list[dict[str, str]]] = {n: [] for n in names}
    try:
        writers = {n: WRITERS[target.to](p, schema, **(target.writer_options or {}))
                   for n, p in splits.items()}
        for k, s in enumerate(samples):
            why = s.why if s.values is None else _write(target, writers[s.split], s.values)
            if why is not None:
                if target.strict:
                    raise BadInputError(f"{s.shown or s.name}: {why}")
                skipped[s.split].append({"path": s.name, "reason": why})
            else:
                if s.stored is not None:
                    result.tally(s.stored, s.name)
                output.after_write(splits[s.split], writers[s.split])
            if target.progress is not None:
                target.progress(k + 1, total)
        gone = [s for n in names for s in skipped[n]]
        counts = {n: w.count for n, w in writers.items()}
        if not sum(counts.values()):
            raise BadInputError(f"{where}: wrote 0 samples: {why_empty(gone)}")
        if not all(counts.values()):
            raise BadInputError(f"the {min(counts, key=counts.get)} split got 0 of "
                                f"{sum(counts.values())} samples: raise --val-fraction, or leave "
                                "it out for a single dataset")
        conversion, schema = finish(skipped)
        for name, writer in writers.items():
            files, extra = writer.close()
            root = splits[name]
            entries = tuple(output.entry(root, f) for f in files)
            Manifest(target.to, writer.count, schema, classes, entries,
                     {**conversion, "split": name or None}, tuple(skipped[name]), extra
                     ).write(root)
            result.splits[name or "all"] = writer.count
            result.written += writer.count
            result.bytes_out += sum(e.size for e in entries)
        result.skipped = gone
    except BaseException as exc:
        abandon(exc, writers.values(), output, Path(target.out), tmp)
    output.commit()
    result.seconds = time.perf_counter() - target.t0
    return result


def _write(target: PackTarget, writer: DatasetWriter, values: dict[str, Any]) -> str | None:
    """Append one sample; why it cannot be stored (a value its field cannot hold), or None."""
    try:
        if target.key0 is not None and target.to == "wds":
            writer.write(values, key=sample_key(target.key0 + writer.count))  # type: ignore
        else:
            writer.write(values)
    except (TypeError, ValueError) as exc:
        if not target.skip_bad_values:
            raise
        return f"cannot store: {exc}"
    return None
