"""What a merge writes per format, over the parts already inside the dataset (no data copied).

Each builder returns the merged files it wrote (as manifest entries) and the format's ``extra``;
all reading and writing goes through the output's :class:`feedpipe.storage.Store` (a local
folder, or an object-store prefix for WebDataset).
"""

from __future__ import annotations

import io
from typing import Any, BinaryIO, Callable, Protocol

import numpy as np

from feedpipe.dataset.formats.wds import CRC_FILE, INDEX_FILES, VALUES_FILE
from feedpipe.dataset.manifest import FileEntry, Manifest
from feedpipe.errors import BadInputError
from feedpipe.schema.model import Schema
from feedpipe.storage.store import Store

Built = tuple[list[FileEntry], dict[str, Any]]


class Builder(Protocol):
    names: tuple[str, ...]  # the files it writes at the dataset's top level

    def build(self, store: Store, parts: list[Manifest], dirs: list[str],
              schema: Schema) -> Built: ...


def _load(store: Store, name: str) -> np.ndarray:
    """The .npy array ``name`` of the store (no pickle)."""
    return np.load(io.BytesIO(store.read_bytes(name)), allow_pickle=False)


def _write(store: Store, name: str, write_fn: Callable[[BinaryIO], None]) -> FileEntry:
    """Write ``name`` atomically; its manifest entry."""
    return FileEntry(name, *store.write(name, write_fn))


def _save(arr: np.ndarray) -> Callable[[BinaryIO], None]:
    def write(fh: BinaryIO) -> None:
        np.save(fh, arr, allow_pickle=False)
    return write


class WdsMerge:
    """One shard list (the parts' shards, in part order) and one index over them."""

    names: tuple[str, ...] = (*INDEX_FILES, CRC_FILE, VALUES_FILE)  # values: with index fields

    def build(self, store: Store, parts: list[Manifest], dirs: list[str],
              schema: Schema) -> Built:
        cols: list[list[np.ndarray]] = [[], [], [], []]
        shards: list[str] = []
        kept = parts[0].extra.get("index_fields")
        in_index = np.asarray([f.name in (kept or ()) for f in schema], bool)
        values: list[np.ndarray] = []  # the index fields' packed values, part by part
        packed = 0
        for m, d in zip(parts, dirs):
            if m.extra.get("index_fields") != kept:
                raise BadInputError(f"{d}: index fields {m.extra.get('index_fields')}, the first "
                                    f"part has {kept}; convert every part with the same options")
            arrays = [_load(store, f"{d}/{n}") for n in INDEX_FILES]
            crc = _load(store, f"{d}/{CRC_FILE}")
            arrays[1] = arrays[1].astype(np.int32) + len(shards)
            if kept:  # spans of index fields point into the packed values: shift them
                arrays[0] = np.array(arrays[0], np.int64)
                arrays[0][:, in_index, 0] += packed
                values.append(_load(store, f"{d}/{VALUES_FILE}"))
                packed += len(values[-1])
            for col, a in zip(cols, [*arrays, crc]):
                col.append(a)
            shards += [f"{d}/{s}" for s in m.extra.get("shards", [])]
        offsets, shard_of, keys, crcs = (np.concatenate(c) for c in cols)
        keys = keys.astype(f"S{max(1, max((k.dtype.itemsize for k in cols[2]), default=1))}")
        if len(keys) > 1 and not bool((keys[1:] > keys[:-1]).all()):
            k = int(np.flatnonzero(keys[1:] <= keys[:-1])[0])
            raise BadInputError(f"key {keys[k + 1].decode()} follows {keys[k].decode()}: keys "
                                "repeat or leave the source order across parts; convert every part "
                                "with this feedpipe's --part")
        arrays = [offsets, shard_of, keys, crcs]
        if kept:
            arrays.append(np.concatenate(values).astype(np.uint8))
        written = [_write(store, name, _save(arr)) for name, arr in zip(self.names, arrays)]
        return written, {"shards": shards, **({"index_fields": kept} if kept else {})}


class PartsMerge:
    """Nothing to write: the reader opens the parts' files (``extra.parts``) together (LMDB
    environments, HDF5 files)."""

    names: tuple[str, ...] = ()

    def build(self, store: Store, parts: list[Manifest], dirs: list[str],
              schema: Schema) -> Built:
        return [], ({"compression": parts[0].extra.get("compression")}
                    if "compression" in parts[0].extra else {})


BUILDERS: dict[str, Builder] = {"wds": WdsMerge(), "lmdb": PartsMerge(), "hdf5": PartsMerge()}

