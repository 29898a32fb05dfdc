"""The versioned dataset manifest (``feedpipe.json``): written last, it is what makes a directory
valid; without a complete one an interrupted conversion is refused (:class:`BadInputError`)."""

from __future__ import annotations

import itertools
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import BadInputError, ConfigError, DamagedDataError
from ..paths import KINDS, url_scheme, write_atomic
from ..schema.model import Schema
from ..storage.store import file_digest

MANIFEST_NAME = "feedpipe.json"
MANIFEST_VERSION = 1
# Version 2 adds a crc32 per record and field, checked on every read; LMDB version 1 still
# reads. WebDataset version 3 keeps the source path in the index, not the tars; HDF5 version 3
# keeps variable-length values as bytes and offsets, not HDF5 variable-length types. Older
# versions of those two are refused (OLDEST_VERSIONS): re-convert.
FORMAT_VERSIONS = {"lmdb": 2, "hdf5": 3, "wds": 3}
OLDEST_VERSIONS = {"lmdb": 1, "hdf5": 3, "wds": 3}
#: the most samples (and bytes in a file) a manifest may declare: beyond any real dataset, and far
#: from where int64 index arithmetic overflows; a larger or negative count is a DamagedDataError
MAX_SAMPLES = 1 << 48
MAX_FILE_BYTES = 1 << 56
#: files each format's reader opens by a fixed name, checked like the ones the manifest names
FORMAT_FILES = {"lmdb": ("data.mdb",), "hdf5": ("data.h5",),
                "wds": ("index-offsets.npy", "index-shards.npy", "index-keys.npy",
                        "index-values.npy")}


def refuse_url(location: str | os.PathLike[str], what: str) -> None:
    """Raise ConfigError for a URL-looking ``location`` where only a local path works, so that
    ``s3://bucket/ds`` never becomes a local folder named ``s3:``."""
    scheme = url_scheme(location)
    if scheme is not None:
        mangled = "://" not in os.fspath(location)
        raise ConfigError(f"{location}: {what} is a {scheme}:// URL, and this takes a local path "
                          "only (remote datasets: docs/remote.md)"
                          + ("; pass a URL as a str: pathlib.Path drops one of its slashes"
                             if mangled else ""))


@dataclass(frozen=True)
class FileEntry:
    """One data file of a dataset with its size and SHA-256, checked by ``feedpipe verify``."""

    name: str
    size: int
    sha256: str

    @classmethod
    def of(cls, root: Path, name: str) -> "FileEntry":
        """Hash a file written under ``root``."""
        return cls(name, *file_digest(root / name))


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
            raise DamagedDataError(f"unknown format {self.format!r}; known: {sorted(FORMAT_VERSIONS)}")
        if not self.format_version:
            object.__setattr__(self, "format_version", FORMAT_VERSIONS[self.format])

    def to_json(self) -> dict[str, Any]:
        return {"feedpipe_manifest": MANIFEST_VERSION, "feedpipe_version": __version__,
                "format": self.format, "format_version": self.format_version,
                "num_samples": self.num_samples, "schema": self.schema.to_json(),
                "classes": list(self.classes), "files": [vars(f) for f in self.files],
                "conversion": self.conversion, "skipped": list(self.skipped),
                "extra": self.extra, "complete": True}

    def write(self, root: Path) -> None:
        """Write atomically: the last step of every conversion."""
        write_atomic(Path(root) / MANIFEST_NAME, self.encoded())

    def encoded(self) -> bytes:
        """The manifest file's bytes (what :meth:`write` writes; a store uploads them)."""
        return json.dumps(self.to_json(), indent=1, ensure_ascii=False).encode("utf-8")

    @classmethod
    def read(cls, root: str | os.PathLike[str]) -> "Manifest":
        """Read and validate; a missing or partial manifest means the conversion did not finish."""
        refuse_url(root, "the dataset")
        root = Path(root)
        path = root / MANIFEST_NAME
        if root.is_file():
            raise BadInputError(_what_file(root))
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: no such dataset directory")
        if not path.is_file():
            raise _not_a_dataset(root)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise BadInputError(f"{path}: manifest is not valid JSON; the conversion "
                                "did not finish. Re-run `feedpipe convert`.") from exc
        if not isinstance(d, dict) or d.get("complete") is not True:
            raise BadInputError(f"{path}: manifest is not marked complete; the "
                                "conversion did not finish.")
        if d.get("feedpipe_manifest") != MANIFEST_VERSION:
            raise DamagedDataError(f"{path}: manifest version {d.get('feedpipe_manifest')!r} is not "
                                   f"supported (this feedpipe reads version {MANIFEST_VERSION}); "
                                   "upgrade feedpipe or re-convert")
        fmt = d.get("format")
        if not isinstance(fmt, str) or fmt not in FORMAT_VERSIONS:
            raise DamagedDataError(f"{path}: unknown format {fmt!r}")
        if d.get("format_version") not in range(1, FORMAT_VERSIONS[fmt] + 1):
            raise DamagedDataError(f"{path}: {fmt} format version {d.get('format_version')!r} is not "
                                   f"supported (expected 1 to {FORMAT_VERSIONS[fmt]})")
        if d["format_version"] < OLDEST_VERSIONS[fmt]:
            raise DamagedDataError(f"{path}: {fmt} format version {d['format_version']} is no "
                                   f"longer read (this feedpipe reads {fmt} version "
                                   f"{OLDEST_VERSIONS[fmt]}); re-convert the dataset from its "
                                   f"source (feedpipe convert SRC --to {fmt} -o OUT)")
        check_fields(d, path)
        try:
            manifest = cls(
                format=fmt, num_samples=int(d["num_samples"]), schema=Schema.from_json(d["schema"]),
                classes=tuple(str(c) for c in d.get("classes", [])),
                files=tuple(FileEntry(str(f["name"]), int(f["size"]), str(f["sha256"]))
                            for f in d.get("files", [])),
                conversion=dict(d.get("conversion", {})),
                skipped=tuple(dict(s) for s in d.get("skipped", [])),
                extra=dict(d.get("extra", {})), format_version=int(d["format_version"]))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise DamagedDataError(f"{path}: malformed manifest: {exc!r}") from exc
        manifest.check_paths(root)
        return manifest

    def check_paths(self, root: Path) -> None:
        """Refuse every file name this manifest makes a reader open (or a DALI index be written
        beside) unless it is a plain name or relative ``a/b`` path (a merged dataset's parts)
        inside ``root``: a manifest must never lead feedpipe outside its dataset."""
        path = root / MANIFEST_NAME
        names = [(f"files[{i}].name", f.name) for i, f in enumerate(self.files)]
        names += [(f"extra.shards[{i}]", s) for i, s in enumerate(self.extra.get("shards", []))]
        names += [(f"extra.parts[{i}].dir", p.get("dir"))  # types checked by check_fields
                  for i, p in enumerate(self.extra.get("parts", []))]
        names += [(f"{self.format} data file", n) for n in FORMAT_FILES[self.format]]
        inside = root.resolve()
        for what, name in names:
            if not isinstance(name, str) or os.path.isabs(name) \
                    or any(c in name for c in ("\\", "\0")) \
                    or any(part in ("", ".", "..") for part in name.split("/")):
                raise DamagedDataError(f"{path}: {what} is {name!r}: a dataset file must be a plain "
                                       "name or a relative path inside the dataset directory (no "
                                       "absolute path, no '..' or '.', no empty component, no "
                                       "backslash); refusing to open it")
            try:
                real = (root / name).resolve()
            except (OSError, RuntimeError) as exc:  # a symlink loop
                raise DamagedDataError(f"{path}: {what} {name!r} cannot be resolved: {exc}") \
                    from exc
            if not real.is_relative_to(inside):
                raise DamagedDataError(f"{path}: {what} {name!r} is a symlink to {real}, outside "
                                       f"the dataset directory {inside}; refusing to open it")
            if not what.startswith("extra.parts"):  # a part is a folder
                _refuse_special(path, what, name, real)


def _refuse_special(path: Path, what: str, name: str, real: Path) -> None:
    """Refuse a dataset file that exists but is not a regular file (a FIFO would block every
    read forever); a missing one is left to the reader or ``verify``, which name it."""
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        kind = KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise DamagedDataError(f"{path}: {what} {name!r} is {kind}, not a regular file; reading "
                               "it could block forever, so it is refused before it is opened. "
                               "Put the dataset's file back (or re-convert).", file=str(real))


def _integer(d: dict[str, Any], key: str, what: str, path: Path, low: int, high: int,
             optional: bool = False) -> None:
    """Refuse ``d[key]`` unless it is an int in ``low..high`` (None too when ``optional``)."""
    v = d.get(key)
    if v is None and optional:
        return
    if key not in d:
        raise DamagedDataError(f"{path}: {what} is missing", file=path)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise DamagedDataError(f"{path}: {what} is {v!r}: expected an integer from {low:,} to "
                               f"{high:,}", file=path)


def _typed(value: Any, kind: type, what: str, path: Path, each: type | None = None) -> None:
    """Refuse ``value`` unless it is a ``kind`` (a list whose items are ``each``s)."""
    items = value if isinstance(value, list) and each is not None else []
    bad = next((i for i, x in enumerate(items) if not isinstance(x, each)),  # type: ignore[arg-type]
               None)
    if not isinstance(value, kind) or bad is not None:
        where, got = (what, value) if bad is None else (f"{what}[{bad}]", items[bad])
        want = kind.__name__ if bad is None else each.__name__  # type: ignore[union-attr]
        raise DamagedDataError(f"{path}: {where} is {type(got).__name__} {got!r:.60}, not a {want}",
                               file=path)


def check_fields(d: dict[str, Any], path: Path) -> None:
    """Refuse a manifest field of the wrong type or out of range, naming the field and the file,
    before any reader takes it for a count, a size or a limit (``num_samples: -5`` or ``2**63``,
    ``max_pixels: "big"`` would otherwise fail deep inside, or allocate)."""
    _integer(d, "num_samples", "num_samples", path, 0, MAX_SAMPLES)
    for key, kind, each in (("classes", list, str), ("files", list, dict), ("skipped", list, dict),
                            ("conversion", dict, None), ("extra", dict, None)):
        if key in d:
            _typed(d[key], kind, key, path, each)
    for i, f in enumerate(d.get("files", [])):
        _typed(f.get("name"), str, f"files[{i}].name", path)
        _integer(f, "size", f"files[{i}].size", path, 0, MAX_FILE_BYTES)
        _typed(f.get("sha256"), str, f"files[{i}].sha256", path)  # verify compares its value
    for limit in ("max_pixels", "max_scans", "max_pixels_per_byte"):  # the loader applies them
        _integer(d.get("conversion", {}), limit, f"conversion.{limit}", path, 1, MAX_FILE_BYTES,
                 optional=True)
    extra = d.get("extra", {})
    _typed(extra.get("shards", []), list, "extra.shards", path)
    _typed(extra.get("parts", []), list, "extra.parts", path, dict)
    for i, part in enumerate(extra.get("parts", [])):
        _integer(part, "num_samples", f"extra.parts[{i}].num_samples", path, 0, MAX_SAMPLES)


_IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif"})


def _not_a_dataset(root: Path) -> BadInputError:
    """A folder without a manifest, said for what it is: a folder of datasets (a split root's
    or --val-fraction's output), an image folder, or a conversion that did not finish."""
    inner = sorted(p.parent.name for p in root.glob(f"*/{MANIFEST_NAME}"))
    if inner:
        return BadInputError(
            f"{root}: holds {len(inner)} datasets, one per split ({', '.join(inner)}), not one "
            f"dataset; open one of them, e.g. {root / inner[0]}")
    if (root / "parts").is_dir():
        return BadInputError(f"{root}: holds conversion parts but no merged dataset: "
                             f"run `feedpipe merge {root}`")
    looked = itertools.islice(root.rglob("*"), 10_000)  # an error path: a bounded look
    images = next((p for p in looked if p.suffix.lower() in _IMAGE_SUFFIXES), None)
    if images is not None:
        return BadInputError(
            f"{root}: is a folder of images ({images.relative_to(root)}...), not a packed "
            f"dataset; pack it first: feedpipe convert {root} --to lmdb -o OUT, then open OUT")
    return BadInputError(
        f"{root}: no {MANIFEST_NAME}; the conversion did not finish or this is not a feedpipe "
        "dataset. Re-run `feedpipe convert`.")


def _what_file(path: Path) -> str:
    """Why a file is not a dataset, and what to run: a dataset is a directory."""
    if (path.parent / MANIFEST_NAME).is_file():  # packed/data.mdb: a file of a dataset
        return (f"{path}: is a file of the dataset {path.parent}; pass the dataset folder "
                f"({path.parent}), not one of its files")
    with open(path, "rb") as fh:
        head = fh.read(512)
    if head[:2] == b"\x1f\x8b":
        what = "a gzip file (a .tgz WebDataset shard?)"
        run = (f"feedpipe convert {path.parent} --to wds -o OUT (gzip cannot be read in "
               "place), then open OUT")
    elif head[257:262] == b"ustar" or path.suffix.lower() == ".tar":
        what = "a tar file (a WebDataset shard?)"
        run = (f"feedpipe index {path.parent} (reads the shards in place) or feedpipe convert "
               f"{path.parent} --to lmdb -o OUT")
    else:
        what = "a file"
        run = "feedpipe convert SRC --to lmdb -o OUT, then open OUT"
    return (f"{path}: is {what}, not a dataset directory; feedpipe opens the folder a conversion "
            f"or an index wrote. Run: {run}")
