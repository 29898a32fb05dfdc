"""The versioned dataset manifest (``feedpipe.json``): written last, it is what makes a directory valid.

A directory without a complete manifest is refused with :class:`IncompleteDatasetError`, so an
interrupted conversion never reads as a dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import IncompleteDatasetError, ManifestError, UnsafePathError
from .schema import Schema

MANIFEST_NAME = "feedpipe.json"
MANIFEST_VERSION = 1
# Version 2 adds a crc32 per record and field, checked on every read; version 1 still reads.
FORMAT_VERSIONS = {"lmdb": 2, "hdf5": 2, "wds": 2}
#: files each format's reader opens by a fixed name, checked like the ones the manifest names
FORMAT_FILES = {"lmdb": ("data.mdb",), "hdf5": ("data.h5",),
                "wds": ("index-offsets.npy", "index-shards.npy", "index-keys.npy")}


@dataclass(frozen=True)
class FileEntry:
    """One data file of a dataset with its size and SHA-256, checked by ``feedpipe verify``."""

    name: str
    size: int
    sha256: str

    @classmethod
    def of(cls, root: Path, name: str) -> "FileEntry":
        """Hash a file written under ``root``."""
        path = root / name
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
        return cls(name, path.stat().st_size, h.hexdigest())


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to trust and open a dataset directory."""

    format: str
    num_samples: int
    schema: Schema
    classes: tuple[str, ...] = ()
    files: tuple[FileEntry, ...] = ()
    conversion: dict[str, Any] = field(default_factory=dict)
    skipped: tuple[dict[str, str], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = 0

    def __post_init__(self) -> None:
        if self.format not in FORMAT_VERSIONS:
            raise ManifestError(f"unknown format {self.format!r}; known: {sorted(FORMAT_VERSIONS)}")
        if not self.format_version:
            object.__setattr__(self, "format_version", FORMAT_VERSIONS[self.format])

    def to_json(self) -> dict[str, Any]:
        from . import __version__

        return {
            "feedpipe_manifest": MANIFEST_VERSION,
            "feedpipe_version": __version__,
            "format": self.format,
            "format_version": self.format_version,
            "num_samples": self.num_samples,
            "schema": self.schema.to_json(),
            "classes": list(self.classes),
            "files": [vars(f) for f in self.files],
            "conversion": self.conversion,
            "skipped": list(self.skipped),
            "extra": self.extra,
            "complete": True,
        }

    def write(self, root: Path) -> None:
        """Write atomically (temp file, fsync, rename): the last step of every conversion."""
        path = Path(root) / MANIFEST_NAME
        tmp = path.with_suffix(".json.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.to_json(), fh, indent=1, ensure_ascii=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    @classmethod
    def read(cls, root: str | os.PathLike[str]) -> "Manifest":
        """Read and validate; a missing or partial manifest means the conversion did not finish."""
        root = Path(root)
        path = root / MANIFEST_NAME
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: no such dataset directory")
        if not path.is_file():
            hint = ""
            if (root / "train" / MANIFEST_NAME).is_file():
                hint = f" (it holds a train/val split: open {root / 'train'} or {root / 'val'})"
            raise IncompleteDatasetError(
                f"{root}: no {MANIFEST_NAME}; the conversion did not finish or this is not a "
                f"feedpipe dataset{hint}. Re-run `feedpipe convert`.")
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise IncompleteDatasetError(f"{path}: manifest is not valid JSON; the conversion "
                                         "did not finish. Re-run `feedpipe convert`.") from exc
        if not isinstance(d, dict) or d.get("complete") is not True:
            raise IncompleteDatasetError(f"{path}: manifest is not marked complete; the "
                                         "conversion did not finish.")
        if d.get("feedpipe_manifest") != MANIFEST_VERSION:
            raise ManifestError(f"{path}: manifest version {d.get('feedpipe_manifest')!r} is not "
                                f"supported (this feedpipe reads version {MANIFEST_VERSION}); "
                                "upgrade feedpipe or re-convert")
        fmt = d.get("format")
        if not isinstance(fmt, str) or fmt not in FORMAT_VERSIONS:
            raise ManifestError(f"{path}: unknown format {fmt!r}")
        if d.get("format_version") not in range(1, FORMAT_VERSIONS[fmt] + 1):
            raise ManifestError(f"{path}: {fmt} format version {d.get('format_version')!r} is not "
                                f"supported (expected 1 to {FORMAT_VERSIONS[fmt]})")
        try:
            manifest = cls(
                format=fmt,
                num_samples=int(d["num_samples"]),
                schema=Schema.from_json(d["schema"]),
                classes=tuple(str(c) for c in d.get("classes", [])),
                files=tuple(FileEntry(str(f["name"]), int(f["size"]), str(f["sha256"]))
                            for f in d.get("files", [])),
                conversion=dict(d.get("conversion", {})),
                skipped=tuple(dict(s) for s in d.get("skipped", [])),
                extra=dict(d.get("extra", {})),
                format_version=int(d["format_version"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ManifestError(f"{path}: malformed manifest: {exc!r}") from exc
        manifest.check_paths(root)
        return manifest

    def check_paths(self, root: Path) -> None:
        """Refuse every file name this manifest makes a reader open (or a DALI index be written
        beside) unless it is a plain name of a file inside ``root``: a manifest must never lead
        feedpipe outside its dataset."""
        path = root / MANIFEST_NAME
        names = [(f"files[{i}].name", f.name) for i, f in enumerate(self.files)]
        shards = self.extra.get("shards", [])
        if not isinstance(shards, list):
            raise ManifestError(f"{path}: extra.shards is {type(shards).__name__}, not a list of "
                                "shard file names")
        names += [(f"extra.shards[{i}]", s) for i, s in enumerate(shards)]
        names += [(f"{self.format} data file", n) for n in FORMAT_FILES[self.format]]
        inside = root.resolve()
        for what, name in names:
            if not isinstance(name, str) or name in ("", ".", "..") or os.path.isabs(name) \
                    or any(c in name for c in ("/", "\\", "\0")):
                raise UnsafePathError(f"{path}: {what} is {name!r}: a dataset file must be a plain "
                                      "name inside the dataset directory (no absolute path, no "
                                      "'..', no path separator); refusing to open it")
            try:
                real = (root / name).resolve()
            except (OSError, RuntimeError) as exc:  # a symlink loop
                raise UnsafePathError(f"{path}: {what} {name!r} cannot be resolved: {exc}") \
                    from exc
            if not real.is_relative_to(inside):
                raise UnsafePathError(f"{path}: {what} {name!r} is a symlink to {real}, outside "
                                      f"the dataset directory {inside}; refusing to open it")
