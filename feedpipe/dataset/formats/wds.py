"""WebDataset tar shards (``prefix-000000.tar``…) plus a random-access index (layout:
docs/convert.md, "On-disk formats").

The shards stay readable by ``webdataset`` and DALI unchanged; the index gives O(1) reads with
``os.pread``, every member checked against its crc32. The source ``path`` stays in the index,
not the tars (format version 3): a member costs ~1 kB of header and padding, 2.7% of a 39 kB
photo. Members that would need unpickling are refused, never opened. No dataset id is written:
the index binds every member by offset, size and crc32.

The tar streaming and grouping are feedpipe's own rather than ``webdataset.tariterators``: they
stream faster with the same checks (``benchmarks/bench_wds_stream.py``), and webdataset's skip
members silently and raise untyped errors, where feedpipe names the shard and key of every
problem.
"""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, ClassVar, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from ...errors import (
    ConfigError,
    CorruptRecordError,
    DamagedDataError,
    DataFileMismatchError,
    FeedpipeError,
    UnsafeDataError,
)
from ...schema.codecs import crc32
from ...schema.fields import Field, JsonField
from ...schema.model import Schema
from ..manifest import Manifest
from .base import DatasetReader, DatasetWriter, Visitor, sample_key, unsafe_name
from .handles import DATA_ERRNOS, MAX_OPEN, OpenFiles, open_error

T = TypeVar("T")
_BAD_KEY = re.compile(r"[./\\\x00\s]")
INDEX_FILES = ("index-offsets.npy", "index-shards.npy", "index-keys.npy")
CRC_FILE = "index-crc32.npy"
VALUES_FILE = "index-values.npy"  # version 3: index fields' encoded values, packed
INDEX_FIELDS = ("path",)  # JSON fields kept in the index, not the tars, by default


def check_key(key: str) -> str:
    """Reject keys that would break WebDataset grouping (dots, slashes, '..', whitespace)."""
    if not key or _BAD_KEY.search(key):
        raise ConfigError(f"WebDataset key {key!r} must be non-empty and contain no '.', '/', "
                          "'\\', whitespace or NUL (the first '.' separates key and suffix)")
    return key


def write_index(root: Path, nf: int, offsets: list[list[tuple[int, int]]], shard_of: list[int],
                keys: list[bytes], crcs: list[list[int]], save: Any = None) -> None:
    """The index files beside the shards (also written for foreign shards indexed in place by
    ``feedpipe index``); ``save(path, array)`` defaults to ``np.save``."""
    save = save or (lambda path, arr: np.save(path, arr, allow_pickle=False))
    save(root / INDEX_FILES[0], np.asarray(offsets, dtype=np.int64).reshape(len(offsets), nf, 2))
    save(root / INDEX_FILES[1], np.asarray(shard_of, np.int32))
    save(root / INDEX_FILES[2], np.asarray(keys, dtype="S").reshape(-1) if keys
         else np.zeros(0, "S1"))
    save(root / CRC_FILE, np.asarray(crcs, np.uint32).reshape(-1, nf))


_USTAR_TAIL = (b"0" + bytes(100) + tarfile.POSIX_MAGIC + bytes(32 + 32 + 8 + 8 + 155 + 12))


def ustar_header(name: str, size: int) -> bytes:
    """The ustar header block ``tarfile`` writes for a regular file (mode 0444, uid/gid/mtime 0),
    byte for byte, built directly: ``TarInfo.tobuf`` took about half a WebDataset conversion's
    time (benchmarks/RESULTS.md)."""
    raw = name.encode(tarfile.ENCODING, "surrogateescape")
    if len(raw) > 100:
        raise ConfigError(f"WebDataset member {name}: name is too long (ustar names hold at most "
                         "100 bytes)")
    if not 0 <= size < 8 ** 11:
        raise ConfigError(f"WebDataset member {name}: {size} bytes do not fit a ustar member")
    head = b"%s0000444\x000000000\x000000000\x00%011o\x0000000000000\x00        %s" % (
        raw.ljust(100, b"\x00"), size, _USTAR_TAIL)
    return b"%s%06o\x00 %s" % (head[:148], sum(head), head[156:])


def tar_members(fh: BinaryIO, path: Path) -> Iterator[tuple[str, bytes]]:
    """Yield ``(member name, data)`` for the regular files of a tar stream; a damaged header or
    a cut-short member is a CorruptRecordError naming the last good member."""
    last = "the first member"
    try:
        with tarfile.open(fileobj=fh, mode="r|") as tar:
            for info in tar:
                if info.isfile():
                    data = tar.extractfile(info)
                    content = data.read() if data else b""
                    if len(content) != info.size:
                        raise tarfile.ReadError(f"member {info.name} is cut short "
                                                f"({len(content)} of {info.size} bytes)")
                    yield info.name, content
                    last = f"member {info.name}"
    except (tarfile.TarError, EOFError, UnicodeError, ValueError, OverflowError) as exc:
        raise CorruptRecordError(f"{path}: damaged tar shard after {last}: {exc}") from exc


def group_by_key(members: Iterable[tuple[str, T]], path: Path | str = "shard",
                 on_unsafe: Callable[[str], None] | None = None
                 ) -> Iterator[tuple[str, dict[str, T]]]:
    """Group consecutive members sharing a key (the name before the first '.'). A member that
    would need unpickling is never opened: it goes to ``on_unsafe`` (default: an
    UnsafeDataError)."""
    key: str | None = None
    group: dict[str, T] = {}
    for name, data in members:
        base = name.rsplit("/", 1)[-1]
        k, _, suffix = base.partition(".")
        if unsafe_name(base):
            if on_unsafe is None:
                raise UnsafeDataError(f"{path} key {k}: member {name} would need unpickling; "
                                      "feedpipe never executes stored data", key=k)
            on_unsafe(name)
            continue
        if k != key and group:
            yield key, group  # type: ignore[misc]
            group = {}
        key = k
        group[suffix] = data
    if group:
        yield key, group  # type: ignore[misc]


_BLOCK, _RECORD = tarfile.BLOCKSIZE, tarfile.RECORDSIZE


class WdsWriter(DatasetWriter):
    """Streams samples into shards bounded by ``shard_size`` bytes and ``shard_count`` samples."""

    format_name = "wds"

    def __init__(self, root: Path, schema: Schema, *, prefix: str = "shard",
                 shard_size: int = 256 << 20, shard_count: int = 10_000,
                 index_fields: Sequence[str] = INDEX_FIELDS) -> None:
        """``index_fields``: the JSON fields of ``schema`` stored in the index instead of as tar
        members (``()`` keeps every field in the tars, e.g. for other tools that want them)."""
        super().__init__(root, schema)
        check_key(prefix)
        if shard_size <= 0 or shard_count <= 0:
            raise ConfigError(f"shard_size={shard_size}, shard_count={shard_count}: both must be "
                              "positive (bytes and samples per shard)", option="shard_size")
        bad = [f.name for f in schema if f.name in index_fields and not isinstance(f, JsonField)]
        if bad:
            raise ConfigError(f"index_fields {bad}: only JSON fields (small metadata such as the "
                              "source path) can be kept in the WebDataset index")
        self._in_index = [f.name in index_fields for f in schema]
        self._values = bytearray()  # the index fields' payloads, packed
        self.prefix, self.shard_size, self.shard_count = prefix, shard_size, shard_count
        self.shards: list[str] = []
        self._tar: BinaryIO | None = None
        self._offset = 0  # bytes written to the open shard
        self._in_shard = 0
        self._offsets: list[list[tuple[int, int]]] = []
        self._crcs: list[list[int]] = []
        self._shard_of: list[int] = []
        self._keys: list[bytes] = []
        self._next_key: str | None = None

    def write(self, sample: dict[str, Any], key: str | None = None) -> None:
        """Append a sample; ``key`` defaults to the zero-padded sample index."""
        self._next_key = check_key(key) if key is not None else None
        super().write(sample)

    def _start_shard(self) -> None:
        self._close_shard()
        name = f"{self.prefix}-{len(self.shards):06d}.tar"
        self.shards.append(name)
        self._tar = open(self.root / name, "wb")
        self._offset = self._in_shard = 0

    def _close_shard(self) -> None:
        if self._tar is not None:  # the end-of-archive blocks, padded to whole records, as tarfile
            end = self._offset + 2 * _BLOCK
            self._tar.write(bytes(2 * _BLOCK + (-end) % _RECORD))
            self._tar.close()
            self._tar = None

    def _write(self, index: int, values: list[Any]) -> None:
        key = self._next_key or sample_key(index)
        payloads = [f.encode(v) for f, v in zip(self.schema, values, strict=True)]
        # headers first: a bad name fails before any member is written (half a sample breaks
        # grouping)
        headers = [None if kept else ustar_header(f"{key}.{f.wds_suffix}", len(p))
                   for f, p, kept in zip(self.schema, payloads, self._in_index, strict=True)]
        size = sum(len(p) + 1024 for p, h in zip(payloads, headers, strict=True) if h is not None)
        if (self._tar is None or self._in_shard >= self.shard_count
                or (self._in_shard and self._offset + size > self.shard_size)):
            self._start_shard()
        assert self._tar is not None
        spans = []
        for head, data in zip(headers, payloads, strict=True):
            if head is None:  # an index field: its span is in the packed values
                spans.append((len(self._values), len(data)))
                self._values += data
                continue
            pad = (-len(data)) % _BLOCK
            self._tar.writelines((head, data, bytes(pad)))
            spans.append((self._offset + _BLOCK, len(data)))
            self._offset += _BLOCK + len(data) + pad
        self._offsets.append(spans)
        self._crcs.append([crc32(p) for p in payloads])
        self._shard_of.append(len(self.shards) - 1)
        self._keys.append(key.encode())
        self._in_shard += 1

    def close(self) -> tuple[list[str], dict[str, Any]]:
        if not self.shards:  # an empty dataset still has one (empty) shard
            self._start_shard()
        self._close_shard()
        write_index(self.root, len(self.schema), self._offsets, self._shard_of, self._keys,
                    self._crcs)
        kept = [f.name for f, k in zip(self.schema, self._in_index, strict=True) if k]
        if not kept:  # the version 2 layout: every field a tar member
            return [*self.shards, *INDEX_FILES, CRC_FILE], {"shards": list(self.shards)}
        np.save(self.root / VALUES_FILE, np.frombuffer(self._values, np.uint8),
                allow_pickle=False)
        return ([*self.shards, *INDEX_FILES, CRC_FILE, VALUES_FILE],
                {"shards": list(self.shards), "index_fields": kept})


class WdsReader(DatasetReader):
    """Random access through the index (``os.pread``) and sequential streaming per shard; at
    most ``max_open_shards`` shards open at once per process (:class:`OpenFiles`)."""

    format_name = "wds"
    _handles: ClassVar[tuple[str, ...]] = ("_fds",)
    _fds: OpenFiles | None

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest | None = None, *,
                 max_open_shards: int = MAX_OPEN) -> None:
        super().__init__(root, manifest)
        if isinstance(max_open_shards, bool) or not isinstance(max_open_shards, int) \
                or max_open_shards < 1:
            raise ConfigError(f"max_open_shards={max_open_shards!r}: use an int >= 1 (shard "
                              "files a process keeps open)", option="max_open_shards")
        self.max_open_shards = max_open_shards
        self.shards: list[str] = list(self.manifest.extra.get("shards", []))

        def load(name: str) -> np.ndarray:
            self.check_size(name, os.stat(self.root / name).st_size)
            return np.load(self.root / name, mmap_mode="r", allow_pickle=False)

        kept = self.manifest.extra.get("index_fields", [])
        if not isinstance(kept, list) or not set(kept) <= {
                f.name for f in self.schema if isinstance(f, JsonField)}:
            raise DamagedDataError(f"{self.root}: extra.index_fields {kept!r} must list JSON fields "
                                   "of the schema")
        self._in_index = [f.name in kept for f in self.schema]
        try:
            self._offsets, self._shard_of, self._keys = (load(n) for n in INDEX_FILES)
            self._crc = load(CRC_FILE)
            self._values = load(VALUES_FILE) if kept else None
        except (OSError, ValueError) as exc:  # missing, cut short, or not plain npy
            if isinstance(exc, OSError) and exc.errno not in DATA_ERRNOS:  # too many open files
                raise open_error(exc, exc.filename or self.root) from exc
            raise CorruptRecordError(f"{self.root}: damaged WebDataset index ({exc}); re-convert "
                                     "the dataset", dataset=self.root) from exc
        nf = len(self.schema)
        if len(self._offsets) != len(self) or len(self._shard_of) != len(self) \
                or len(self._keys) != len(self) or self._offsets.shape[1:] != (nf, 2) \
                or self._crc.shape != (len(self), nf) \
                or (self._values is not None and self._values.dtype != np.uint8):
            raise CorruptRecordError(f"{self.root}: index has {len(self._offsets)} entries of "
                                     f"{self._offsets.shape[1:]}, manifest says {len(self)} "
                                     f"samples of {nf} fields", dataset=self.root)
        self.check_root()  # the index came from the manifest's directory
        self._fields = list(self.schema)
        # shard numbers in range and in order, member spans inside their shard's recorded size:
        # a damaged index is refused before it can send a read astray
        sizes = {f.name: f.size for f in self.manifest.files}
        limit = np.asarray([sizes.get(s, 0) for s in self.shards] or [0], np.int64)
        sh = np.asarray(self._shard_of, np.int64)
        off = np.asarray(self._offsets, np.int64)
        end = off[..., 0] + off[..., 1]
        inx = np.asarray(self._in_index, bool)
        packed = len(self._values) if self._values is not None else 0
        ok = not len(sh) or (
            0 <= sh.min() and sh.max() < len(self.shards) and bool((np.diff(sh) >= 0).all())
            and off.min() >= 0 and bool((end[:, ~inx].max(axis=1, initial=0) <= limit[sh]).all())
            and end[:, inx].max(initial=0) <= packed)
        if not ok:
            raise CorruptRecordError(f"{self.root}: the WebDataset index points outside its "
                                     "shards; it is damaged: re-convert the dataset",
                                     dataset=self.root)

    def tar_fields(self) -> list[tuple[int, Field]]:
        """(schema position, field) of the fields stored as tar members (not in the index)."""
        return [(c, f) for c, f in enumerate(self.schema) if not self._in_index[c]]

    def key_of(self, index: int) -> str:
        """The sample's WebDataset key (``__key__``)."""
        return self._keys[index].decode("utf-8", "backslashreplace")  # a damaged index still names

    def describe(self, index: int) -> str:
        shard = self.shards[int(self._shard_of[index])]
        return f"{self.root} (wds) shard {shard} key {self.key_of(index)}"

    def shard_ranges(self) -> list[range]:
        """The sample indices held by each shard, in shard order."""
        bounds = np.searchsorted(self._shard_of, np.arange(len(self.shards) + 1))
        return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _open(self) -> None:
        if self._fds is not None:  # a forked child's: its copies were closed at the fork
            self._fds.close()
        self._fds = OpenFiles(self, self.max_open_shards)

    def _open_shard(self, shard: int) -> int:
        """A read-only descriptor of shard ``shard`` (the remote reader fetches it first); a
        failure not about the file (too many open files) is a ResourceError."""
        path = self.root / self.shards[shard]
        try:
            return os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise open_error(exc, path) from exc

    def _fd(self, shard: int) -> int:
        assert self._fds is not None
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._open_shard(shard)
            try:
                self.check_root()  # shards open lazily: maybe after a re-conversion's swap
                self.check_size(self.shards[shard], os.fstat(fd).st_size)
            except BaseException:
                os.close(fd)
                raise
            self._fds.add(shard, fd)
        return fd

    def _visit(self, indices: Sequence[int], fn: Visitor, fields: list[Field]) -> None:
        cols = [self._fields.index(f) for f in fields]
        # the batch's index rows in one gather each: indexing the memory-mapped index per
        # sample pays numpy's memmap.__getitem__ per lookup (benchmarks/RESULTS.md)
        rows = np.asarray(indices, np.int64)
        shard_of = self._shard_of[rows].tolist()
        offsets = self._offsets[rows].tolist()
        checks = self._crc[rows].tolist()
        for pos, i in enumerate(indices):
            try:  # per sample: ``fn`` may read through this reader, closing the LRU's oldest
                fd = self._fd(shard_of[pos])
            except DataFileMismatchError as exc:  # shards are read one by one: so are they lost
                raise self.corrupt(i, str(exc)) from exc
            except FeedpipeError:  # typed already: not damage (ResourceError, a store's)
                raise
            except OSError as exc:  # a missing or unreadable shard: name the sample
                raise self.corrupt(i, f"cannot open its shard: {exc}") from exc
            stored = {}
            for f, c in zip(fields, cols, strict=True):
                off, size = offsets[pos][c]
                if self._in_index[c]:
                    data = bytes(self._values[off: off + size])  # type: ignore[index]
                else:
                    data = os.pread(fd, size, off)
                if len(data) != size:
                    raise self.corrupt(i, f"member {f.wds_suffix} truncated "
                                          f"({len(data)} of {size} bytes)")
                if crc32(data) != checks[pos][c]:
                    raise self.corrupt(i, f"member {f.wds_suffix} fails its checksum")
                try:
                    stored[f.name] = f.decode(data, f.wds_suffix)
                except UnsafeDataError as exc:  # keep the type: callers refuse, not skip
                    raise self.unsafe(i, exc) from exc
                except Exception as exc:
                    raise self.corrupt(i, f"undecodable member: {exc}") from exc
            fn(pos, stored)

    def iter_shard(self, shard: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """Stream one shard sequentially: ``(key, stored values)`` in tar order, each sample
        checked against the index (its key and its members' crc32)."""
        path = self.root / self.shards[shard]
        r = self.shard_ranges()[shard]
        names = [f.wds_suffix for f in self.schema]
        # foreign shards indexed in place (feedpipe index): their own member suffixes, and the
        # keys left out of the index (named in the manifest)
        members = self.manifest.extra.get("members") or {}
        alts = [members.get(f.name, [f.wds_suffix]) for f in self.schema]
        unindexed = set((self.manifest.extra.get("unindexed") or {}).get(self.shards[shard], []))
        i = r.start
        with os.fdopen(self._open_shard(shard), "rb") as fh:
            self.check_root()
            for key, group in group_by_key(tar_members(fh, path), path):
                if key in unindexed:
                    continue
                if members:
                    group = {n: group[s] for n, alt in zip(names, alts, strict=True) for s in alt
                             if s in group}
                if i >= r.stop or key != self.key_of(i):
                    want = self.key_of(i) if i < r.stop else "the end of the shard"
                    raise CorruptRecordError(f"{path} key {key}: found where the index has "
                                             f"{want}; the shard is damaged", dataset=self.root,
                                             key=key)
                crcs = self._crc[i].tolist()
                for c, suffix in enumerate(names):
                    if self._in_index[c]:  # its span was checked against the packed values
                        off, size = self._offsets[i, c].tolist()
                        group[suffix] = bytes(self._values[off: off + size])  # type: ignore[index]
                    elif suffix not in group:  # e.g. a shard cut short: name the source
                        raise self.located(self.corrupt(i, f"{path}: member .{suffix} missing"))
                    if crc32(group[suffix]) != crcs[c]:
                        raise self.located(self.corrupt(i, f"member {suffix} fails its "
                                                           "checksum"))
                yield key, {f.name: f.decode(group[f.wds_suffix], f"{path} key {key}")
                            for f in self.schema}
                i += 1
        if i != r.stop:
            raise self.corrupt(i, f"{path} ends after {i - r.start} of {len(r)} samples")

    def close(self) -> None:
        if self._fds is not None:  # closes only this process's own
            self._fds.close()
        self._fds = None
        super().close()

