"""The thin template every format fills in: a writer that appends samples, a lazy reader.

Readers implement one primitive, :meth:`DatasetReader._visit`: each sample's *stored* values
(maybe zero-copy views, valid during the callback) handed to a callback in one read pass;
everything else (``ds[i]``, ``get_batch``, iteration, the loader's decode) is built on it here.
"""

from __future__ import annotations

import functools
import hashlib
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, NoReturn, Sequence, TypeVar

import numpy as np

from ...errors import (
    BadInputError,
    CorruptRecordError,
    DamagedImageError,
    DataFileMismatchError,
    DatasetReplacedError,
    FeedpipeError,
    SampleError,
    UnsafeDataError,
)
from ...schema.fields import Field, ImageField
from ...schema.model import Schema
from ..manifest import Manifest

KEY_DIGITS = 9
UNSAFE_SUFFIXES = frozenset({"pickle", "pkl", "pyd", "pth"})  # what pickle-based tools unpickle
Visitor = Callable[[int, dict[str, Any]], None]
E = TypeVar("E", bound=FeedpipeError)


def root_identity(root: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(device, inode) of a dataset directory: a re-conversion swaps in a new directory."""
    try:
        st = os.stat(root)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def unsafe_name(name: str) -> bool:
    """A member or entry name whose extension says "unpickle me"; feedpipe never opens those."""
    return name.rsplit(".", 1)[-1].lower() in UNSAFE_SUFFIXES if "." in name else False


def sample_key(index: int) -> str:
    """The zero-padded key of sample ``index`` (sorts in index order)."""
    return f"{index:0{KEY_DIGITS}d}"


class DatasetWriter(ABC):
    """Appends samples to a new dataset under ``root`` (a temporary directory owned by the caller)."""

    format_name: ClassVar[str]

    def __init__(self, root: Path, schema: Schema) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.count = 0
        self.content = hashlib.blake2b(digest_size=16)  # what the records' checksums add up to

    def dataset_id(self) -> str:
        """The id written into the data file and the manifest, compared by the reader at open: a
        digest of the records' checksums and count (not random: conversions stay reproducible)."""
        digest = self.content.copy()
        digest.update(self.count.to_bytes(8, "little"))
        return digest.hexdigest()

    def write(self, sample: dict[str, Any]) -> None:
        """Validate and append one sample (a dict with every schema field)."""
        missing = [n for n in self.schema.names if n not in sample]
        if missing:
            raise SampleError(f"sample {self.count} lacks fields {missing}; the schema has "
                              f"{self.schema.names}", key=sample_key(self.count))
        values = [f.validate(sample[f.name]) for f in self.schema]
        self._write(self.count, values)
        self.count += 1

    @abstractmethod
    def _write(self, index: int, values: list[Any]) -> None:
        """Append validated stored values (in schema order) as sample ``index``."""

    @abstractmethod
    def close(self) -> tuple[list[str], dict[str, Any]]:
        """Flush everything; return the data file names and format extras for the manifest."""

    def discard(self) -> None:
        """After a failed conversion (its output is removed): let go of what the writer holds."""
        self.close()

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DatasetReader(ABC):
    """Random-access reader over a finished dataset; opens its files lazily in each process."""

    format_name: ClassVar[str]
    _handles: ClassVar[tuple[str, ...]] = ()

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest | None = None) -> None:
        self.root = Path(root)
        self._root_id = root_identity(self.root)  # before the manifest: see check_root
        self.manifest = manifest or Manifest.read(self.root)
        self.schema: Schema = self.manifest.schema
        self.classes: tuple[str, ...] = self.manifest.classes
        self._pid: int | None = None
        for name in self._handles:
            setattr(self, name, None)

    # -- process-local handles -------------------------------------------------------------------
    def _ensure_open(self) -> None:
        if self._pid != os.getpid():
            self.check_root()
            self._open()
            self.check_root()
            self._pid = os.getpid()

    def check_root(self) -> None:
        """Refuse to read files of a directory swapped in by a re-conversion since the manifest
        was read: old manifest + new data files would be a silent mix of two datasets."""
        if root_identity(self.root) != self._root_id:
            raise DatasetReplacedError(f"{self.root} was replaced (re-converted) after its "
                                       "manifest was read; open the dataset again")

    @abstractmethod
    def _open(self) -> None:
        """Open file handles in the current process."""

    def check_size(self, name: str, size: int) -> None:
        """Refuse data file ``name`` (relative to the root) unless its manifest records ``size``
        (a stat at open; hashing it is ``feedpipe verify``'s job)."""
        entry = next((f for f in self.manifest.files if f.name == name), None)
        if entry is not None and entry.size != size:
            self._mismatch(name, f"{size:,} bytes, its manifest says {entry.size:,}: the file "
                           "was cut short, grown or replaced (another dataset's file copied in?)")

    def check_id(self, name: str, found: object, expected: object) -> None:
        """Refuse data file ``name`` unless the id ``found`` in it (None if absent) is the one its
        manifest recorded (if any: conversions older than the id have none)."""
        if isinstance(found, (bytes, bytearray, memoryview, np.bytes_)):
            found = bytes(found).decode("ascii", "backslashreplace")
        if expected is None or found == expected:
            return
        held = f"holds dataset id {found}" if found is not None else "holds no dataset id"
        self._mismatch(name, f"{held}, its manifest records {expected}: the file belongs to "
                       "another dataset (copied in from another conversion?)")

    def _mismatch(self, name: str, detail: str) -> NoReturn:
        raise DataFileMismatchError(f"{self.root / name}: {detail}; refused before reading it. "
                                    "Restore the file or re-convert the dataset",
                                    dataset=self.root, file=self.root / name)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in self._handles:
            state[name] = None
        state["_pid"] = None
        return state

    # -- the one primitive -----------------------------------------------------------------------
    @abstractmethod
    def _visit(self, indices: Sequence[int], fn: Visitor, fields: list[Field]) -> None:
        """Call ``fn(position, stored_values)`` for each index, in order, in one read pass,
        reading and decoding only ``fields``."""

    # -- everything else -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.manifest.num_samples

    def parts(self, data_file: str) -> tuple[list[str], list[object], np.ndarray]:
        """The data files read (a merged dataset's parts', else its own ``data_file``), each
        one's dataset id, and where each one's samples end (index ``i`` is row ``i - start``)."""
        parts = self.manifest.extra.get("parts") or [
            {"dir": ".", "num_samples": len(self), "dataset_id": self.manifest.extra.get(
                "dataset_id")}]
        ends = np.cumsum([int(p["num_samples"]) for p in parts])
        if ends[-1] != len(self):
            raise CorruptRecordError(f"{self.root}: its parts hold {ends[-1]} samples, the "
                                     f"manifest says {len(self)}", dataset=self.root)
        return ([data_file if p["dir"] == "." else f"{p['dir']}/{data_file}" for p in parts],
                [p.get("dataset_id") for p in parts], ends)

    def require_samples(self, tool: str) -> None:
        """Refuse an empty dataset at once: a loader over it would never yield a batch."""
        if len(self) == 0:
            raise BadInputError(
                f"{self.root}: the dataset holds 0 samples, so {tool} has nothing to read; its "
                f"conversion wrote none (`feedpipe info {self.root}` lists skipped inputs). "
                "Convert a source with readable images.", dataset=self.root)

    def shard_ranges(self) -> list[range] | None:
        """The sample indices each shard holds, for formats read shard by shard (their samplers
        keep ranks on whole shards); None when any sample is as cheap to reach as any other."""
        return None

    def plan_ahead(self, plan: Sequence[Sequence[int] | np.ndarray], position: int) -> None:
        """Called as the sampler hands out batch ``position`` of ``plan``: a remote reader starts
        fetching what the next batches read; local data needs nothing."""
        return None

    def describe(self, index: int) -> str:
        """Where sample ``index`` lives, for error messages."""
        return f"{self.root} ({self.format_name}) key {sample_key(index)}"

    def check_indices(self, indices: Sequence[int]) -> list[int]:
        """Normalize negative indices and reject out-of-range ones with IndexError."""
        n = len(self)
        out = []
        for i in indices:
            j = int(i) + n if int(i) < 0 else int(i)
            if not 0 <= j < n:
                raise IndexError(f"index {i} out of range for dataset of {n} samples ({self.root})")
            out.append(j)
        return out

    def visit(self, indices: Sequence[int], fn: Visitor,
              fields: Sequence[str] | None = None) -> None:
        """Call ``fn(position, stored_values)`` for each of ``indices`` (checked), in order, in
        one read pass, reading only ``fields``. A damaged or unsafe record raises with its key
        and (its ``path`` field still readable) its source file."""
        idx = self.check_indices(indices)
        self._ensure_open()
        try:
            self._visit(idx, fn, list(self.schema) if fields is None
                        else [self.schema[name] for name in fields])
        except (CorruptRecordError, UnsafeDataError) as exc:
            raise self.located(exc)  # noqa: B904 - the same exception, its source added

    @property
    def checksums(self) -> bool:
        """Whether every record carries a crc32 checked on each read (format version >= 2)."""
        return self.manifest.format_version >= 2

    def source_of(self, index: int) -> str | None:
        """The source file of sample ``index`` (its stored ``path`` field), None if unreadable."""
        if "path" not in self.schema:
            return None
        found: list[Any] = []
        try:
            self._ensure_open()
            self._visit([index], lambda _, stored: found.append(stored["path"]),
                        [self.schema["path"]])
        except Exception:  # noqa: BLE001 - a damaged path field only leaves the source unnamed
            return None
        return str(found[0]) if found else None

    def located(self, exc: FeedpipeError) -> FeedpipeError:
        """``exc`` (made by :meth:`corrupt` or :meth:`unsafe`) with the sample's source file added
        to its message, once."""
        index = getattr(exc, "index", None)
        if index is not None and exc.file is None and "path" in self.schema:
            exc.file = self.source_of(index) or "unknown (its path field is unreadable)"
            exc.args = (f"{exc.args[0]} [source file: {exc.file}]", *exc.args[1:])
        return exc

    def read_raw_batch(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Stored values (image bytes undecoded), copied out of the read buffers."""
        out: list[dict[str, Any]] = [{} for _ in indices]
        fields = list(self.schema)

        def keep(pos: int, stored: dict[str, Any]) -> None:
            out[pos] = {f.name: f.materialize(stored[f.name]) for f in fields}

        self.visit(indices, keep)
        return out

    def get_batch(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Decoded samples for ``indices`` (one transaction / read call for the whole batch)."""
        out: list[dict[str, Any]] = [{} for _ in indices]
        limits = self.decode_limits()
        users = [(f.name, functools.partial(f.to_user, limits=limits)
                  if isinstance(f, ImageField) else f.to_user) for f in self.schema]
        idx = self.check_indices(indices)

        def decode(pos: int, stored: dict[str, Any]) -> None:
            try:
                out[pos] = {name: user(stored[name], name) for name, user in users}
            except CorruptRecordError as exc:  # named by key, and (visit) by source file
                raise self.corrupt(idx[pos], str(exc), exc) from exc

        self.visit(idx, decode)
        return out

    def decode_limits(self) -> dict[str, int]:
        """The bounds on decoding one image its converter recorded (``max_pixels``,
        ``max_scans``, ``max_pixels_per_byte``); the defaults apply to the others."""
        recorded = self.manifest.conversion
        return {k: recorded[k] for k in ("max_pixels", "max_scans", "max_pixels_per_byte")
                if recorded.get(k)}

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.get_batch([index])[0]

    def read_raw(self, index: int) -> dict[str, Any]:
        """The stored, undecoded values of one sample."""
        return self.read_raw_batch([index])[0]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for start in range(0, len(self), 256):
            yield from self.get_batch(range(start, min(start + 256, len(self))))

    def key_of(self, index: int) -> str:
        """The key sample ``index`` is stored under."""
        return sample_key(index)

    def corrupt(self, index: int, detail: str, cause: BaseException | None = None
                ) -> CorruptRecordError:
        """A CorruptRecordError naming this dataset and key (:meth:`visit` adds the source).
        When ``cause`` (what failed to decode the record) is damaged image data behind a passed
        checksum, the source file was damaged before conversion, and the message says so."""
        while cause is not None and not isinstance(cause, DamagedImageError):
            cause = cause.__cause__
        if cause is not None and self.checksums:
            detail += ("; the record is as conversion wrote it (its checksum matches): the "
                       "source file was already damaged (`feedpipe convert` refuses such "
                       "files unless --check header)")
        return self._named(CorruptRecordError, index, detail)

    def unsafe(self, index: int, cause: Exception) -> UnsafeDataError:
        """An UnsafeDataError naming this dataset and key: refused, never skipped."""
        return self._named(UnsafeDataError, index, str(cause))

    def _named(self, cls: type[E], index: int, detail: str) -> E:
        exc = cls(f"{self.describe(index)}: {detail}", dataset=self.root, key=self.key_of(index))
        exc.index = index  # type: ignore[attr-defined]
        return exc

    def stray_entries(self) -> list[str]:
        """Entries in the data files that no sample owns (``feedpipe verify`` reports them)."""
        return []

    def close(self) -> None:
        """Close handles held by this process (reopened lazily on next use)."""
        self._pid = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self.root)!r}, samples={len(self)}, "
                f"fields={self.schema.names})")


class ReaderOver(DatasetReader):
    """A reader over opened readers (``sources``: a mix, windows): no file of its own."""

    sources: tuple[DatasetReader, ...]
    _root_id, _pid = None, None

    def _open(self) -> None:
        """Each source opens its own files when first read."""

    def check_root(self) -> None:
        for s in self.sources:
            s.check_root()

    def close(self) -> None:
        for s in self.sources:
            s.close()
        super().close()
