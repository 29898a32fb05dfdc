"""``feedpipe index DIR``: a manifest and WebDataset index written beside foreign ``.tar`` shards,
read in place, never rewritten (docs/sources.md); samples unreadable as they stand are left out,
named."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from feedpipe.dataset.formats.wds import CRC_FILE, INDEX_FILES, write_index
from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry, Manifest
from feedpipe.errors import BadInputError, CorruptRecordError, UnsafeDataError
from feedpipe.paths import atomic_writer
from feedpipe.schema.codecs import crc32
from feedpipe.schema.fields import ArrayField, ImageField, LabelField
from feedpipe.schema.geometric import TextField
from feedpipe.schema.imaging import sniff_codec
from feedpipe.schema.model import Schema

from . import foreign_wds as fw

IN_PLACE_CODECS = ("jpeg", "png", "webp")


@dataclass
class IndexResult:
    """What ``feedpipe index`` did."""

    root: Path
    indexed: int = 0
    shards: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    not_taken: list[dict[str, str]] = field(default_factory=list)
    schema: list[str] = field(default_factory=list)


def _check_folder(root: Path, overwrite: bool) -> list[Path]:
    if not root.is_dir():
        raise BadInputError(f"{root}: not a folder of .tar shards")
    shards, _ = fw.find_shards([root])
    packed = [s for s in shards if not s.name.lower().endswith(".tar")]
    if packed:
        raise BadInputError(f"{packed[0]}: a gzipped shard cannot be read in place (no random "
                            f"access into gzip); pack it instead: feedpipe convert {root} --to "
                            "wds -o OUT (or --to lmdb|hdf5)")
    nested = [s for s in shards if s.parent != root]
    if nested:
        raise BadInputError(f"{nested[0]}: shards in sub-folders; index each folder on its own "
                            f"(feedpipe index {nested[0].parent}) or convert them into one "
                            "dataset")
    if (root / MANIFEST_NAME).exists():
        extra = Manifest.read(root).extra
        if not extra.get("in_place"):
            raise BadInputError(f"{root}: already a feedpipe dataset; nothing to index")
        if not overwrite:
            raise FileExistsError(f"{root}: already indexed; pass --overwrite to index again")
        os.unlink(root / MANIFEST_NAME)  # incomplete until the new manifest is written
    clash = [n for n in (*INDEX_FILES, CRC_FILE) if (root / n).exists()
             and not (root / n).is_file()]
    if clash:
        raise BadInputError(f"{root / clash[0]}: not a file; refusing to write the index")
    return shards


def index_shards(root: str | Path, overwrite: bool = False,
                 max_member_bytes: int = fw.MAX_MEMBER_BYTES) -> IndexResult:
    """Index the foreign ``.tar`` shards of ``root`` in place; members are read whole to checksum
    them, so ones over ``max_member_bytes`` are refused."""
    root = Path(root)
    shards = _check_folder(root, overwrite)
    p = fw.plan([root], max_member_bytes)
    unsafe = [t for t in p.not_taken if "unpickling" in t["reason"]]
    if unsafe:
        raise UnsafeDataError(f"{unsafe[0]['path']}: would need unpickling; feedpipe never "
                              f"executes stored data. Convert instead (it leaves such members "
                              f"out, by name): feedpipe convert {root} --to wds -o OUT")
    res = IndexResult(root, shards=[s.name for s in shards], not_taken=p.not_taken)
    offsets: list[list[tuple[int, int]]] = []
    crcs: list[list[int]] = []
    shard_of: list[int] = []
    keys: list[bytes] = []
    codecs: set[str] = set()
    image_suffixes: set[str] = set()
    unindexed: dict[str, list[str]] = {}
    order = ["cls"] * p.labeled + list(p.fields)
    for n, path in enumerate(shards):
        for key, group in fw.samples(path, [], max_member_bytes):
            img = fw._image_suffix(group)
            missing = [s for s in order if s not in group]
            why = ("no image member" if img is None else
                   "no " + ", ".join(f".{s}" for s in missing) + " member" if missing else
                   _unreadable(p, group, f"{path.name} key {key}"))
            if why is not None or img is None:
                unindexed.setdefault(path.name, []).append(key)
                res.skipped.append({"path": f"{path.name}/{key}", "reason": str(why)})
                continue
            codec = sniff_codec(group[img].data)
            if codec not in IN_PLACE_CODECS:
                raise BadInputError(f"{path} key {key}: a {codec} image cannot be decoded "
                                    f"in place; convert instead: feedpipe convert {root} "
                                    "--to wds -o OUT (lossless formats become PNG)")
            codecs.add(codec)
            image_suffixes.add(img)
            picked = [group[img], *(group[s] for s in order)]
            offsets.append([(m.offset, len(m.data)) for m in picked])
            crcs.append([crc32(m.data) for m in picked])
            shard_of.append(n)
            keys.append(key.encode("utf-8", "surrogateescape"))
    if not keys:
        raise BadInputError(f"{root}: no sample can be indexed: " + "; ".join(
            f"{s['path']}: {s['reason']}" for s in res.skipped[:3]))
    schema = Schema((ImageField("image", codecs.pop() if len(codecs) == 1 else "mixed"),
                     *[LabelField("label")] * p.labeled, *p.fields.values()))
    write_index(root, len(schema), offsets, shard_of, keys, crcs, save=_save_atomic)
    members: dict[str, Any] = {"image": sorted(image_suffixes),
                               **({"label": ["cls"]} if p.labeled else {}),
                               **{f.name: [s] for s, f in p.fields.items()}}
    names = [*res.shards, *INDEX_FILES, CRC_FILE]
    Manifest("wds", len(keys), schema, (), tuple(FileEntry.of(root, f) for f in names),
             {"source": str(root), "source_kind": "wds-in-place", "ignored": p.not_taken},
             tuple(res.skipped),
             {"shards": res.shards, "members": members, "unindexed": unindexed,
              "in_place": True, "foreign_files": res.shards}).write(root)
    res.indexed, res.schema = len(keys), schema.names
    return res


def _unreadable(p: fw.Plan, group: dict[str, fw.Member], what: str) -> str | None:
    """Why a sample's text or array members cannot be read in place as they stand, or None."""
    for s, f in p.fields.items():
        try:
            if isinstance(f, TextField):
                fw.check_text(f, group[s].data, f".{s}")
            elif isinstance(f, ArrayField):
                f.decode(group[s].data, f"{what} .{s}")  # a view: nothing allocated
        except (CorruptRecordError, UnsafeDataError) as exc:
            return f"unreadable member: {exc}"
    return None


def _save_atomic(path: Path, arr: np.ndarray) -> None:
    """``np.save`` atomically: the folder is the user's, and a fixed temp name could be a planted
    symlink."""
    with atomic_writer(path) as fh:
        np.save(fh, arr, allow_pickle=False)
