"""``feedpipe verify``: checksums of every file, then every record re-read (and decoded); and
``feedpipe info``'s manifest read. A folder and a URL (its objects fetched into a temporary
folder) go through one implementation, a :class:`~feedpipe.storage.Store`.

Records are read through the format's reader (each one's crc32 checked); WebDataset shards are
also streamed (damaged tar headers, unsafe members); entries no sample owns are named.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..errors import BadInputError, FeedpipeError, RemoteNotFoundError, ResourceError
from ..storage.store import Store, file_digest, open_store
from .formats.wds import WdsReader
from .manifest import MANIFEST_NAME, Manifest
from .registry import open_dataset

Options = Mapping[str, Any] | None


@dataclass
class VerifyReport:
    """Problems found, each naming the file or the record's key."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files_checked: int = 0
    records_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def read_manifest(source: str | os.PathLike[str] | Store, storage_options: Options = None,
                  into: Path | None = None) -> Manifest:
    """Read and validate the manifest of a dataset folder or URL (:meth:`Manifest.read`'s checks
    either way); a missing one means the conversion did not finish (or is still uploading).
    ``into`` keeps a fetched manifest file in that folder."""
    store = source if not isinstance(source, (str, os.PathLike)) \
        else open_store(source, storage_options)
    if not store.remote:
        return Manifest.read(store.url)
    try:
        raw = store.read_bytes(MANIFEST_NAME)
    except RemoteNotFoundError as exc:
        raise BadInputError(f"{store.url}: no {MANIFEST_NAME}; its conversion did not "
                            "finish (or is still uploading), or this is not a feedpipe "
                            "dataset. Re-run `feedpipe convert`.") from exc
    with tempfile.TemporaryDirectory(prefix="feedpipe-manifest-") if into is None \
            else nullcontext(into) as tmp:
        (Path(tmp) / MANIFEST_NAME).write_bytes(raw)
        return Manifest.read(tmp)


def verify(target: str | os.PathLike[str], *, decode: bool = True, chunk: int = 256,
           storage_options: Options = None, workdir: str | Path | None = None) -> VerifyReport:
    """Check sizes and SHA-256 of the manifest's files, then read every record, of a dataset
    folder or URL (whose objects are fetched into a temporary folder under ``workdir``)."""
    store = open_store(target, storage_options)
    # a local dataset is read in place: no folder to make (or to fail removing, out of fds)
    with tempfile.TemporaryDirectory(prefix="feedpipe-verify-", dir=workdir) if store.remote \
            else nullcontext(store.url) as tmp:
        root = Path(tmp)
        manifest = read_manifest(store, into=root)
        report = _check_files(store, manifest, root)
        if not (store.remote and report.problems):  # records of a missing object repeat them
            _check_records(root, manifest, report, decode, chunk)
    if store.remote:
        report.problems = [p.replace(str(root), store.url) for p in report.problems]
        report.notes = [n.replace(str(root), store.url) for n in report.notes]
    return report


def _check_files(store: Store, manifest: Manifest, into: Path) -> VerifyReport:
    """Each file's size and SHA-256 against the manifest (a remote one fetched ``into``)."""
    report = VerifyReport()
    for entry in manifest.files:
        report.files_checked += 1
        where = store.where(entry.name)
        try:
            size = store.size(entry.name)
            if size != entry.size:
                report.problems.append(f"{where}: size {size}, manifest says {entry.size}")
                continue
            local = store.local(entry.name, into, size)
        except FileNotFoundError:
            report.problems.append(f"{where}: missing")
            continue
        except ResourceError:
            raise
        except (FeedpipeError, OSError) as exc:
            report.problems.append(str(exc))
            continue
        if file_digest(local)[1] != entry.sha256:
            report.problems.append(f"{where}: checksum mismatch")
    return report


def _check_records(root: Path, manifest: Manifest, report: VerifyReport, decode: bool,
                   chunk: int) -> None:
    """Open the dataset at ``root`` and re-read every record, adding what fails to ``report``."""
    try:
        ds = open_dataset(root)
        if hasattr(ds, "num_entries") and ds.num_entries() != len(ds):
            report.problems.append(f"{root}: {ds.num_entries()} records, manifest says {len(ds)}")
    except ResourceError:  # too many open files, no memory: not the dataset's fault
        raise
    except (FeedpipeError, OSError) as exc:  # OSError: a data file is missing or unreadable
        report.problems.append(str(exc))
        return
    if not ds.checksums:
        report.notes.append(f"{root}: format version {manifest.format_version} carries no record "
                            "checksums: a flipped bit inside an image can decode to wrong pixels "
                            "unnoticed; re-convert to add them")
    with _noted(report):
        report.problems += ds.stray_entries()
    if isinstance(ds, WdsReader):  # tar headers and members beyond the index
        for s, name in enumerate(ds.shards):
            if (root / name).is_file():  # a missing one is reported above
                with _noted(report):
                    for _ in ds.iter_shard(s):
                        pass
    read = ds.get_batch if decode else ds.read_raw_batch
    for start in range(0, len(ds), chunk):
        idx = range(start, min(start + chunk, len(ds)))
        try:
            read(idx)
            report.records_checked += len(idx)
        except ResourceError:
            raise
        except (FeedpipeError, OSError):  # find each damaged record of the chunk
            for i in idx:
                with _noted(report):
                    read([i])
                    report.records_checked += 1


@contextmanager
def _noted(report: VerifyReport) -> Iterator[None]:
    """A FeedpipeError or OSError becomes a problem of ``report`` (once: the shard stream may
    have named a record already); a ResourceError (no memory, too many open files) is raised."""
    try:
        yield
    except ResourceError:
        raise
    except (FeedpipeError, OSError) as exc:
        if str(exc) not in report.problems:
            report.problems.append(str(exc))
