"""WebDataset tar parts shared by the writer, the reader and the converters that index foreign
shards: the index file names, member keys, the ustar header, the index files, and the tar
streaming (members, then samples grouped by key).

The tar streaming and grouping here are feedpipe's own rather than ``webdataset.tariterators``:
measured side by side with the same checks (``benchmarks/bench_wds_stream.py``), they stream
faster (figures: benchmarks/RESULTS.md); webdataset's iterators also skip
``__*__`` and non-regular members silently, lowercase suffixes, drop samples they deem invalid and
raise untyped errors, where feedpipe names the shard and key of every problem. ``webdataset`` is
a test dependency only (the interop tests: the library reads our shards).
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, TypeVar

import numpy as np

from ...errors import ConfigError, CorruptRecordError, UnsafeDataError
from .base import unsafe_name

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
