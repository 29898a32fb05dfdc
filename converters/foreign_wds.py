"""WebDataset shards written by other tools (plain or gzipped, folders or brace patterns) as a
record source, the schema inferred from the member suffixes (docs/sources.md). Members are read
whole, so their sizes and ``.npy`` headers are checked before anything is allocated."""

from __future__ import annotations

import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from braceexpand import braceexpand

from feedpipe.dataset.formats.wds import group_by_key
from feedpipe.errors import BadInputError, ConfigError, CorruptRecordError, UnsafeDataError
from feedpipe.schema.codecs import npy_decode
from feedpipe.schema.fields import ArrayField, BytesField, Field, JsonField
from feedpipe.schema.geometric import TextField

from . import hf
from .records import Record, RecordSource, field_name
from .sources import IMAGE_EXTS

SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz")
#: the largest member read from a shard, in bytes (members are read whole); larger ones refused
MAX_MEMBER_BYTES = 256 << 20
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "img", "ppm", "pgm", "bmp", "tif", "tiff", "gif")


def is_shard(path: Path) -> bool:
    return path.name.lower().endswith(SHARD_SUFFIXES)


def find_shards(specs: Sequence[str | Path]) -> tuple[list[Path], list[dict[str, str]]]:
    """The shard files named by ``specs`` (folders, searched recursively; files; brace
    patterns), in order, and the other files of those folders (not taken, named)."""
    shards: list[Path] = []
    other: list[dict[str, str]] = []  # the folders' other files
    for spec in specs:
        names = list(braceexpand(str(spec))) if "{" in str(spec) else [str(spec)]
        for name in names:
            p = Path(name)
            if p.is_dir():
                for f in sorted(p.rglob("*")):
                    if f.is_file() and is_shard(f):
                        shards.append(f)
                    elif f.is_file():
                        other.append({"path": str(f), "reason": "not a .tar/.tgz shard"})
            elif p.is_file():
                if not is_shard(p):
                    raise BadInputError(f"{p}: not a WebDataset shard (.tar, .tgz or .tar.gz)")
                shards.append(p)
            else:
                raise BadInputError(f"{p}: no such shard or folder" +
                                    (f" (from the pattern {spec})" if name != str(spec) else ""))
    if not shards:
        raise BadInputError(f"{', '.join(map(str, specs))}: no .tar/.tgz shards found")
    return shards, other


def looks_like_shards(src: str | Path) -> bool:
    """Whether ``feedpipe convert SRC`` means foreign shards: a shard file, a brace pattern, or a
    folder holding shards, no image files (a stray .tar stays not taken) and no manifest."""
    p = Path(src)
    if "{" in str(src) or is_shard(p):
        return True
    if not p.is_dir() or (p / "feedpipe.json").exists():
        return False
    files = [f for f in p.rglob("*") if f.is_file()]
    return any(is_shard(f) for f in files) and \
        not any(f.suffix.lower() in IMAGE_EXTS for f in files)


@dataclass
class Member:
    """One regular tar member: its name, its data's offset in the uncompressed stream, its bytes."""

    name: str
    offset: int
    data: bytes


def members(path: Path, max_bytes: int = MAX_MEMBER_BYTES) -> Iterator[Member | str]:
    """A shard's regular members, streamed (gzip too), a link or device as its name; a damaged
    tar is a CorruptRecordError, a member over ``max_bytes`` a BadInputError, before it is read."""
    last = "the first member"
    try:
        with open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r|*") as tar:
            for info in tar:
                if info.isdir():
                    continue
                if not info.isfile():
                    yield info.name
                    continue
                if info.size > max_bytes:
                    raise BadInputError(
                        f"{path}: member {info.name} is {info.size:,} bytes, over the limit of "
                        f"{max_bytes:,} (max_member_bytes, --max-member-size); feedpipe reads a "
                        "member whole: raise the limit if the member is real", file=path,
                        key=info.name)
                f = tar.extractfile(info)
                data = f.read() if f else b""
                if len(data) != info.size:
                    raise tarfile.ReadError(f"member {info.name} is cut short")
                yield Member(info.name, info.offset_data, data)
                last = f"member {info.name}"
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise CorruptRecordError(f"{path}: damaged tar shard after {last}: {exc}") from exc


Group = tuple[str, dict[str, Member]]


def samples(path: Path, odd: list[dict[str, str]], max_bytes: int = MAX_MEMBER_BYTES
            ) -> Iterator[Group]:
    """Consecutive members sharing a key, as feedpipe's reader groups them; non-regular and
    unpickle-requiring members go to ``odd``."""

    def regular() -> Iterator[tuple[str, Member]]:
        for m in members(path, max_bytes):
            if isinstance(m, str):
                odd.append({"path": f"{path}/{m}", "reason": "not a regular file"})
            else:
                yield m.name, m

    def unsafe(name: str) -> None:
        odd.append({"path": f"{path}/{name}", "reason": "would need unpickling; never opened"})

    return group_by_key(regular(), path, unsafe)


def _image_suffix(group: dict[str, Member]) -> str | None:
    return next((s for s in IMAGE_SUFFIXES if s in group), None)


@dataclass
class Plan:
    """The schema inferred from a set of shards: suffix → field, and what was not taken."""

    shards: list[Path]
    fields: dict[str, Field]  # member suffix → field (image and label excluded)
    labeled: bool
    count: int
    not_taken: list[dict[str, str]]
    max_member_bytes: int = MAX_MEMBER_BYTES


def _npy(data: bytes, what: str) -> np.ndarray:
    """A ``.npy`` member as an array viewing ``data``, never unpickled; else CorruptRecordError."""
    try:
        return npy_decode(data, what)
    except (UnsafeDataError, ValueError) as exc:  # object arrays need pickle: refused
        raise CorruptRecordError(f"{what}: not a plain .npy array ({exc})") from exc


def plan(specs: Sequence[str | Path], max_member_bytes: int = MAX_MEMBER_BYTES) -> Plan:
    """Read every shard once and infer the schema (docs/sources.md)."""
    if max_member_bytes < 1:
        raise ConfigError(f"max_member_bytes={max_member_bytes}: use a positive byte count",
                          option="max_member_bytes")
    shards, not_taken = find_shards(specs)
    seen: Counter[str] = Counter()
    npy: dict[str, set[tuple[str, tuple[int, ...]]]] = {}
    n = 0
    for path in shards:
        for key, group in samples(path, not_taken, max_member_bytes):
            n += 1
            img = _image_suffix(group)
            for s, m in group.items():
                if s == img:
                    continue
                seen[s] += 1
                if s.rsplit(".", 1)[-1] == "npy":
                    try:
                        a = _npy(m.data, f"{path} key {key}")
                        npy.setdefault(s, set()).add((a.dtype.str, a.shape))
                    except CorruptRecordError:
                        npy.setdefault(s, set())
    fields: dict[str, Field] = {}
    taken: list[str] = ["image", "label", "path"]
    labeled = seen.get("cls", 0) * 2 > n
    for s, c in sorted(seen.items()):
        if s == "cls" and labeled:
            continue
        if c * 2 <= n:
            not_taken.append({"path": f"*.{s}", "reason": f"only {c} of {n} samples have a "
                              f".{s} member: not a field"})
            continue
        name = field_name(s, taken)
        taken.append(name)
        ext = s.rsplit(".", 1)[-1]
        if ext == "json":
            fields[s] = JsonField(name)
        elif ext == "npy" and npy.get(s):
            shapes = {sh for _, sh in npy[s]}
            fields[s] = ArrayField(name, dtype=min(d for d, _ in npy[s]),
                                   shape=shapes.pop() if len(shapes) == 1 else None)
        elif ext == "txt":
            fields[s] = TextField(name)
        else:
            fields[s] = BytesField(name)
    return Plan(shards, fields, labeled, n, not_taken, max_member_bytes)


def _values(group: dict[str, Member], p: Plan) -> tuple[dict[str, Any], int, str | None]:
    """A sample's stored values, its label, and a reason when it cannot be stored."""
    missing = [s for s in ["cls"] * p.labeled + list(p.fields) if s not in group]
    if missing:
        return {}, -1, "no " + ", ".join(f".{s}" for s in missing) + " member"
    values: dict[str, Any] = {}
    label = -1
    try:
        if p.labeled:
            label = int(group["cls"].data.strip())
        for s, f in p.fields.items():
            data = group[s].data
            values[f.name] = (_npy(data, f".{s}") if isinstance(f, ArrayField) else
                              f.decode(data, f".{s}") if isinstance(f, JsonField) else
                              check_text(f, data, f".{s}") if isinstance(f, TextField) else data)
    except (ValueError, TypeError, CorruptRecordError) as exc:
        return {}, -1, f"unreadable member: {exc}"
    return values, label, None


def check_text(f: TextField, data: bytes, what: str) -> bytes:
    """A ``.txt`` member's bytes, unchanged, once they are UTF-8 text without NUL (the loader's
    CTC padding); else a CorruptRecordError saying why."""
    try:
        f.validate(f.text(data, what))
    except ValueError as exc:
        raise CorruptRecordError(f"{what}: {exc}") from exc
    return data


def source(specs: Sequence[str | Path], max_member_bytes: int = MAX_MEMBER_BYTES
           ) -> RecordSource:
    """Foreign shards as a :class:`RecordSource` for :func:`converters.convert`."""
    p = plan(specs, max_member_bytes)

    def records() -> Iterator[Record]:
        for path in p.shards:
            for key, group in samples(path, [], p.max_member_bytes):
                img = _image_suffix(group)
                values, label, why = _values(group, p)
                if img is None:
                    why = "no image member (" + ", ".join(f".{s}" for s in group) + ")"
                yield Record(f"{path.name}/{key}", group[img].data if img else None, label, values,
                             why)

    roots = tuple(sorted({s.parent for s in p.shards}))
    return RecordSource(roots, "wds-shards", tuple(p.fields.values()), (), p.labeled, p.count,
                        records, tuple(p.not_taken),
                        {"shards": [str(s) for s in p.shards],
                         "members": {f.name: s for s, f in p.fields.items()}})


def record_source(src: str | Path, split: str = "train", max_member_bytes: int | None = None
                  ) -> RecordSource | None:
    """The in-memory record source ``feedpipe convert SRC`` names (foreign shards or a Hugging
    Face dataset), or None for the file sources :func:`converters.convert` scans."""
    s = str(src)
    if s.startswith("hf://") or hf.is_saved_dataset(Path(s)):
        return hf.source(s, split)
    if looks_like_shards(s):
        return source([s], max_member_bytes or MAX_MEMBER_BYTES)
    return None
