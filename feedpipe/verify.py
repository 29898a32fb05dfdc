"""``feedpipe verify``: checksums of every file, then every record re-read (and decoded)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import FeedpipeError
from .formats import open_dataset
from .manifest import FileEntry, Manifest


@dataclass
class VerifyReport:
    """Problems found, each naming the file or the record's key."""

    problems: list[str] = field(default_factory=list)
    files_checked: int = 0
    records_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(path: str | os.PathLike[str], *, decode: bool = True, chunk: int = 256) -> VerifyReport:
    """Check sizes and SHA-256 of the manifest's files, then read every record."""
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
    except (FeedpipeError, OSError) as exc:  # OSError: a data file is missing or unreadable
        report.problems.append(str(exc))
        return report
    read = ds.get_batch if decode else ds.read_raw_batch
    for start in range(0, len(ds), chunk):
        idx = range(start, min(start + chunk, len(ds)))
        try:
            read(idx)
            report.records_checked += len(idx)
        except (FeedpipeError, OSError):  # find each damaged record of the chunk
            for i in idx:
                try:
                    read([i])
                    report.records_checked += 1
                except (FeedpipeError, OSError) as exc:
                    report.problems.append(str(exc))
    return report
