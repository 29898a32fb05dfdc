"""``feedpipe verify``: checksums of every file, then every record re-read (and decoded).

Records are read through the format's reader, so each one's crc32 is checked (format version 2);
WebDataset shards are also streamed, which finds damaged tar headers and unsafe members, and
entries no sample owns (an extra LMDB key, HDF5 dataset or tar member) are reported by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FeedpipeError, ResourceError
from .formats.wds import WdsReader
from .manifest import FileEntry, Manifest, refuse_url
from .registry import open_dataset


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


def verify(path: str | os.PathLike[str], *, decode: bool = True, chunk: int = 256) -> VerifyReport:
    """Check sizes and SHA-256 of the manifest's files, then read every record."""
    refuse_url(path, "the dataset")
    root = Path(path)
    manifest = Manifest.read(root)
    report = VerifyReport()
    for entry in manifest.files:
        report.files_checked += 1
        if not (root / entry.name).is_file():
            report.problems.append(f"{root / entry.name}: missing")
            continue
        actual = FileEntry.of(root, entry.name)
        if actual.size != entry.size:
            report.problems.append(f"{root / entry.name}: size {actual.size}, manifest "
                                   f"says {entry.size}")
        elif actual.sha256 != entry.sha256:
            report.problems.append(f"{root / entry.name}: checksum mismatch")
    try:
        ds = open_dataset(root)
        if hasattr(ds, "num_entries") and ds.num_entries() != len(ds):
            report.problems.append(f"{root}: {ds.num_entries()} records, manifest says {len(ds)}")
    except ResourceError:  # too many open files, no memory: not the dataset's fault
        raise
    except (FeedpipeError, OSError) as exc:  # OSError: a data file is missing or unreadable
        report.problems.append(str(exc))
        return report
    if not ds.checksums:
        report.notes.append(f"{root}: format version {manifest.format_version} carries no record "
                            "checksums: a flipped bit inside an image can decode to wrong pixels "
                            "unnoticed; re-convert to add them")
    try:
        report.problems += ds.stray_entries()
    except ResourceError:
        raise
    except (FeedpipeError, OSError) as exc:
        report.problems.append(str(exc))
    if isinstance(ds, WdsReader):  # tar headers and members beyond the index
        for s, name in enumerate(ds.shards):
            try:
                if (root / name).is_file():  # a missing one is reported above
                    for _ in ds.iter_shard(s):
                        pass
            except ResourceError:
                raise
            except (FeedpipeError, OSError) as exc:
                report.problems.append(str(exc))
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
                try:
                    read([i])
                    report.records_checked += 1
                except ResourceError:
                    raise
                except (FeedpipeError, OSError) as exc:
                    if str(exc) not in report.problems:  # the shard stream may have named it
                        report.problems.append(str(exc))
    return report
