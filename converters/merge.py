"""``feedpipe merge OUT [PART...]``: one dataset out of the parts of a split conversion, which it
contains at ``OUT/parts/part-IIIII-of-NNNNN`` (moved in with one ``rename``, never copied). The
manifest, written last, is the commit point: an interrupted merge never reads as a dataset, and
running it again finishes it."""

from __future__ import annotations

import errno
import fnmatch
import glob
import hashlib
import io
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from feedpipe.dataset.formats.wds import CRC_FILE, INDEX_FILES, VALUES_FILE
from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry, Manifest
from feedpipe.dataset.verify import read_manifest
from feedpipe.errors import BadInputError
from feedpipe.paths import cache_dir
from feedpipe.schema.model import Schema
from feedpipe.storage.store import Store, open_store

from .parts import PARTS_DIR, Part
from .swap import OutputLock, fsync_dir, shown

log = logging.getLogger(__name__)
#: conversion entries that describe one part only; the merged manifest sums or drops them
_PER_PART = ("part", "inputs", "stored", "ignored", "empty_classes", "split",
             "jpegs_needing_fallback_decoder", "channels_dropped", "jpeg_transcoded",
             "jpeg_progressive_kept")


@dataclass
class MergeResult:
    """What a merge did, for the CLI summary and for callers."""

    out: Path | str  # a URL for a merge in object storage
    parts: int = 0
    moved: int = 0
    num_samples: int = 0
    empty_classes: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class PartInfo:
    """One part as found: where it is, its manifest and its ``conversion.part`` entry."""

    path: Path | str  # a URL for a part in object storage
    manifest: Manifest
    part: Part
    start: int
    stop: int
    source_items: int
    fingerprint: str


class MergeTarget:
    """Every file step of a merge, over its output's :class:`~feedpipe.storage.Store` (a local
    directory or an object-store prefix): list and adopt parts, write the merged files
    atomically, write the manifest last (the commit point). A local merge moves parts in with
    one rename; an object store has no renames, so there it takes only the parts already in."""

    def __init__(self, out: str | os.PathLike[str],
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.store: Store = open_store(out, storage_options)
        if self.store.remote:  # two merges of one URL on this machine
            where = cache_dir() / "merge"
            where.mkdir(parents=True, exist_ok=True)
            self.lock = OutputLock(where / hashlib.sha256(self.store.url.encode()).hexdigest()[:16])
        else:
            self.out = Path(out)
            self.lock = OutputLock(self.out)

    def listed_parts(self) -> list[str]:
        """Part folders already inside the dataset, ``parts/part-*-of-*`` (not the hidden
        partial ones)."""
        names = {n.split("/")[1] for n in self.store.names()
                 if n.startswith(PARTS_DIR + "/") and n.count("/") >= 2}
        return [self.part_path(n) for n in sorted(names) if fnmatch.fnmatch(n, "part-*-of-*")]

    def check_target(self, names: set[str]) -> None:
        """OUT may hold only its parts and what an interrupted merge of it left."""
        url = self.store.url
        if not self.store.remote:
            if self.out.is_symlink() or (self.out.exists() and not self.out.is_dir()):
                raise BadInputError(f"{url}: not a directory; choose another output")
        held = self.store.names()
        if MANIFEST_NAME in held:
            raise BadInputError(f"{url}: already a complete dataset (it has "
                                f"{MANIFEST_NAME}); merge into a new output")
        foreign = sorted({n.split("/")[0] for n in held if not n.startswith(PARTS_DIR + "/")
                          and n not in names and not n.startswith(".")})
        if foreign:
            raise BadInputError(f"{url}: holds files a merge did not make "
                                f"({shown(foreign)}); choose another output")

    def adopt(self, src: str | os.PathLike[str], name: str) -> bool:
        """Move a part folder into ``OUT/parts/<name>`` with one rename; False when it is
        already there. On an object store it must already be there (objects are never copied)."""
        dest = self.part_path(name)
        if self.store.remote:
            if str(src).rstrip("/") == dest:
                return False
            raise BadInputError(f"{src}: on object storage a merge takes only the parts already "
                                f"under {self.store.where(PARTS_DIR)}/ (it never copies shards); "
                                f"convert them with `feedpipe convert ... -o {self.store.url} "
                                "--part i/N`")
        src, to = Path(src), Path(dest)
        if src.resolve() == to.resolve():
            return False
        if to.exists() or to.is_symlink():
            raise BadInputError(f"{src}: {to} already exists and is another directory; move one "
                             "of them away")
        to.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(src, to)
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                raise BadInputError(f"{src}: on another filesystem than {self.out}; a merge moves "
                                 "parts, it never copies them: write the parts with "
                                 f"`feedpipe convert ... -o {self.out} --part i/N` (they land "
                                 f"in {to.parent}) or move them there yourself") from exc
            raise
        fsync_dir(to.parent)
        return True

    def part_path(self, name: str) -> str:
        return self.store.where(f"{PARTS_DIR}/{name}")

    def commit(self, manifest: Manifest) -> None:
        """Write the manifest last: the commit point (made durable in a local folder)."""
        if not self.store.remote:
            fsync_dir(self.out)
        self.store.write(MANIFEST_NAME, lambda fh: fh.write(manifest.encoded()))
        if not self.store.remote:
            fsync_dir(self.out)


def expand(parts: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Part arguments as paths: a glob pattern (quoted on the command line) is expanded."""
    out: list[Path] = []
    for p in parts:
        text = os.fspath(p)
        if not os.path.exists(text) and glob.has_magic(text):
            found = sorted(glob.glob(text))
            if not found:
                raise BadInputError(f"{text}: the pattern matches no part directory")
            out += [Path(f) for f in found]
        else:
            out.append(Path(text))
    return out


def read_part(path: Path | str, storage_options: Mapping[str, Any] | None = None) -> PartInfo:
    """A part's manifest (complete, or BadInputError naming it) and its part entry; ``path``: a
    folder, or a URL with its ``storage_options``."""
    m = read_manifest(path, storage_options)
    p = m.conversion.get("part")
    if not isinstance(p, dict):
        raise BadInputError(f"{path}: not a part of a split conversion (its manifest has no "
                            "conversion.part; convert with --part i/N)")
    try:
        return PartInfo(path, m, Part(int(p["index"]), int(p["count"])), int(p["start"]),
                        int(p["stop"]), int(p["source_items"]), str(p["fingerprint"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInputError(f"{path}: malformed conversion.part in its manifest: {exc!r}") from exc


def check_parts(infos: list[PartInfo]) -> tuple[list[PartInfo], Schema]:
    """All N parts of one conversion, each once: returns them in part order and the merged
    schema. Every refusal names the parts and the difference."""
    if not infos:
        raise BadInputError("no parts given and none inside the output's parts/ folder")
    first = infos[0]
    schema = first.manifest.schema
    for info in infos[1:]:
        where = f"{info.path} and {first.path}"
        if info.manifest.format != first.manifest.format:
            raise BadInputError(f"{where}: formats differ ({info.manifest.format} and "
                                f"{first.manifest.format})")
        if info.part.count != first.part.count:
            raise BadInputError(f"{where}: split into {info.part.count} and {first.part.count} "
                                "parts; convert every part with the same --part i/N count")
        if info.manifest.classes != first.manifest.classes:
            a, b = set(info.manifest.classes), set(first.manifest.classes)
            diff = (f"only in {info.path}: {sorted(a - b)}; only in {first.path}: {sorted(b - a)}"
                    if a != b else "same names in another order")
            raise BadInputError(f"{where}: class lists differ ({diff})")
        schema = _merge_schema(schema, info, first)
        if info.fingerprint != first.fingerprint or info.source_items != first.source_items:
            raise BadInputError(f"{where}: converted from different source lists or options (source "
                                f"items {info.source_items} and {first.source_items}, fingerprints "
                                f"{info.fingerprint[:12]} and {first.fingerprint[:12]})")
    by_index: dict[int, PartInfo] = {}
    for info in infos:
        if info.part.index in by_index:
            raise BadInputError(f"part {info.part.index} of {info.part.count} given twice: "
                                f"{by_index[info.part.index].path} and {info.path}")
        by_index[info.part.index] = info
    missing = [i for i in range(first.part.count) if i not in by_index]
    if missing:
        names = ", ".join(Part(i, first.part.count).name for i in missing[:5])
        raise BadInputError(f"{len(missing)} of {first.part.count} parts missing: {names}"
                            + (" ..." if len(missing) > 5 else "") + "; convert them, then merge")
    ordered = [by_index[i] for i in range(first.part.count)]
    for info in ordered:
        want = info.part.bounds(info.source_items)
        if (info.start, info.stop) != want:
            raise BadInputError(f"{info.path}: holds source items {info.start}..{info.stop}, part "
                                f"{info.part.index}/{info.part.count} is {want[0]}..{want[1]}")
    return ordered, schema


def _merge_schema(schema: Schema, info: PartInfo, first: PartInfo) -> Schema:
    """The schemas must agree field by field; only the image codec of LMDB/HDF5 parts may
    differ (their records do not depend on it: the merged field says "mixed")."""
    other = info.manifest.schema
    if schema.names != other.names:
        raise BadInputError(f"{info.path} and {first.path}: schemas have different fields "
                            f"({other.names} and {schema.names})")
    fields = []
    for a, b in zip(schema, other, strict=True):
        if a.to_json() == b.to_json():
            fields.append(a)
        elif (a.name == "image" and info.manifest.format != "wds"
              and {**a.to_json(), "codec": ""} == {**b.to_json(), "codec": ""}):
            fields.append(replace(a, codec="mixed"))
        else:
            raise BadInputError(f"{info.path} and {first.path}: schemas differ in field {a.name!r} "
                                f"({b.to_json()} and {a.to_json()})")
    return Schema(tuple(fields))


def merge(out: str | os.PathLike[str], parts: Sequence[str | os.PathLike[str]] = (),
          storage_options: Mapping[str, Any] | None = None) -> MergeResult:
    """Merge the parts of a split conversion into the dataset ``out``: those already in
    ``out/parts/`` and ``parts`` (folders or glob patterns). A part missing, given twice, or from
    another source, schema or class list is a :class:`~feedpipe.errors.BadInputError` before anything
    is moved. On object storage (WebDataset only) the parts already under ``out/parts/`` merge in
    place."""
    t0 = time.perf_counter()
    target = MergeTarget(out, storage_options)
    seen: dict[str, str | Path] = {}
    for p in [*target.listed_parts(), *(expand(parts) if not target.store.remote else parts)]:
        key = str(p).rstrip("/") if target.store.remote else str(Path(p).resolve())
        seen.setdefault(key, key if target.store.remote else Path(p))
    infos = [read_part(p, storage_options) for p in seen.values()]
    if not target.store.remote:
        target.out.parent.mkdir(parents=True, exist_ok=True)
    ordered, schema = check_parts(infos)
    fmt = ordered[0].manifest.format
    if target.store.remote and fmt != "wds":
        raise BadInputError(f"{out}: parts are {fmt}; on object storage only WebDataset parts "
                         "merge (LMDB and HDF5 would need several files opened together). Use "
                         "--to wds for remote data, or merge the parts in a local folder")
    target.lock.acquire()
    result = MergeResult(str(out) if target.store.remote else Path(out), parts=len(ordered))
    try:
        target.check_target(set(WDS_NAMES) if fmt == "wds" else set())
        adopted = []
        for info in ordered:
            result.moved += target.adopt(info.path, info.part.name)
            where = target.part_path(info.part.name)
            adopted.append(replace(info, path=where if target.store.remote else Path(where)))
        dirs = [f"{PARTS_DIR}/{info.part.name}" for info in adopted]
        manifests = [i.manifest for i in adopted]
        files, extra = _wds_index(target.store, manifests, dirs, schema) if fmt == "wds" else \
            ([], {k: v for k, v in manifests[0].extra.items() if k == "compression"})
        for d, info in zip(dirs, adopted, strict=True):
            files += [FileEntry(f"{d}/{f.name}", f.size, f.sha256) for f in info.manifest.files]
            raw = target.store.read_bytes(f"{d}/{MANIFEST_NAME}")  # the part's manifest
            files.append(FileEntry(f"{d}/{MANIFEST_NAME}", len(raw), hashlib.sha256(raw).hexdigest()))
        extra["parts"] = [{"dir": d, "num_samples": i.manifest.num_samples,
                           "start": i.start, "stop": i.stop,
                           **{k: v for k, v in i.manifest.extra.items() if k == "dataset_id"}}
                          for d, i in zip(dirs, adopted, strict=True)]
        target.commit(_merged_manifest(adopted, schema, files, extra, result))
    finally:
        target.lock.release()
    result.seconds = time.perf_counter() - t0
    return result


def _merged_manifest(infos: list[PartInfo], schema: Schema, files: list[FileEntry],
                     extra: dict[str, Any], result: MergeResult) -> Manifest:
    """Counts summed, per-part accounts joined, and the classes no part holds named."""
    first = infos[0].manifest
    conversion = {k: v for k, v in first.conversion.items() if k not in _PER_PART}
    stored: dict[str, int] = {}
    for info in infos:
        for how, n in info.manifest.conversion.get("stored", {}).items():
            stored[how] = stored.get(how, 0) + int(n)
    ignored = list(first.conversion.get("ignored", []))  # the source's, the same in every part
    empty = set(first.classes).intersection(
        *(i.manifest.conversion.get("empty_classes", first.classes) for i in infos))
    result.empty_classes = [c for c in first.classes if c in empty]
    if result.empty_classes:
        log.warning("%s: class(es) with no samples in any part: %s", result.out,
                    ", ".join(result.empty_classes))
    result.num_samples = sum(i.manifest.num_samples for i in infos)
    conversion.update({"inputs": infos[0].source_items, "stored": stored, "ignored": ignored,
                       "empty_classes": result.empty_classes,
                       "jpeg_transcoded": sum(int(i.manifest.conversion.get("jpeg_transcoded", 0))
                                              for i in infos),
                       "jpeg_progressive_kept": [k for i in infos for k in
                                                 i.manifest.conversion.get("jpeg_progressive_kept",
                                                                           [])],
                       "merged": {"parts": len(infos), "fingerprint": infos[0].fingerprint}})
    skipped = tuple(s for i in infos for s in i.manifest.skipped)
    return Manifest(first.format, result.num_samples, schema, first.classes, tuple(files),
                    conversion, skipped, extra)


#: the merged WebDataset index's files at the dataset's top level (values: with index fields);
#: LMDB and HDF5 write none (the reader opens the parts' files, ``extra.parts``, together)
WDS_NAMES = (*INDEX_FILES, CRC_FILE, VALUES_FILE)


def _wds_index(store: Store, parts: list[Manifest], dirs: list[str], schema: Schema
               ) -> tuple[list[FileEntry], dict[str, Any]]:
    """One shard list (the parts' shards, in part order) and one index over them, written
    atomically through ``store``: the files written and the manifest's ``extra``."""

    def load(name: str) -> np.ndarray:
        return np.load(io.BytesIO(store.read_bytes(name)), allow_pickle=False)

    cols: list[list[np.ndarray]] = [[], [], [], []]  # offsets, shard of, keys, CRCs
    shards: list[str] = []
    kept = parts[0].extra.get("index_fields")
    in_index = np.asarray([f.name in (kept or ()) for f in schema], bool)
    values: list[np.ndarray] = []  # the index fields' packed values, part by part
    packed = 0
    for m, d in zip(parts, dirs, strict=True):
        if m.extra.get("index_fields") != kept:
            raise BadInputError(f"{d}: index fields {m.extra.get('index_fields')}, the first "
                                f"part has {kept}; convert every part with the same options")
        offsets, shard_of, keys, crcs = (load(f"{d}/{n}") for n in (*INDEX_FILES, CRC_FILE))
        if kept:  # spans of index fields point into the packed values: shift them
            offsets = np.array(offsets, np.int64)
            offsets[:, in_index, 0] += packed
            values.append(load(f"{d}/{VALUES_FILE}"))
            packed += len(values[-1])
        for col, a in zip(cols, (offsets, shard_of.astype(np.int32) + len(shards), keys, crcs),
                          strict=True):
            col.append(a)
        shards += [f"{d}/{s}" for s in m.extra.get("shards", [])]
    arrays = [np.concatenate(c) for c in cols]  # keys: the widest parts' byte strings
    keys = arrays[2]
    if len(keys) > 1 and not bool((keys[1:] > keys[:-1]).all()):
        k = int(np.flatnonzero(keys[1:] <= keys[:-1])[0])
        raise BadInputError(f"key {keys[k + 1].decode()} follows {keys[k].decode()}: keys "
                            "repeat or leave the source order across parts; convert every part "
                            "with this feedpipe's --part")
    if kept:
        arrays.append(np.concatenate(values).astype(np.uint8))
    written = [FileEntry(n, *store.write(n, lambda fh, a=a: np.save(fh, a, allow_pickle=False)))
               for n, a in zip(WDS_NAMES, arrays, strict=True)]
    return written, {"shards": shards, **({"index_fields": kept} if kept else {})}
