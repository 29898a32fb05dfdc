"""What a merge writes per format, over the parts already inside the dataset (no data copied).

Each builder returns the merged files it wrote (as manifest entries) and the format's ``extra``;
all reading and writing goes through the output's :class:`feedpipe.storage.Store` (a local
folder, or an object-store prefix for WebDataset).
"""

from __future__ import annotations

import hashlib
import io
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Protocol

import h5py
import numpy as np

from feedpipe.dataset.formats.hdf5 import FILE_NAME, ID_ATTR
from feedpipe.dataset.formats.wds import CRC_FILE, INDEX_FILES, VALUES_FILE
from feedpipe.dataset.manifest import FileEntry, Manifest
from feedpipe.errors import PartsError
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
                raise PartsError(f"{d}: index fields {m.extra.get('index_fields')}, the first "
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
            raise PartsError(f"key {keys[k + 1].decode()} follows {keys[k].decode()}: keys "
                             "repeat or leave the source order across parts; convert every part "
                             "with this feedpipe's --part")
        arrays = [offsets, shard_of, keys, crcs]
        if kept:
            arrays.append(np.concatenate(values).astype(np.uint8))
        written = [_write(store, name, _save(arr)) for name, arr in zip(self.names, arrays)]
        return written, {"shards": shards, **({"index_fields": kept} if kept else {})}


class LmdbMerge:
    """Nothing to write: the reader opens the parts' environments (``extra.parts``) together."""

    names: tuple[str, ...] = ()

    def build(self, store: Store, parts: list[Manifest], dirs: list[str],
              schema: Schema) -> Built:
        return [], {}


class Hdf5Merge:
    """``data.h5`` of virtual datasets (HDF5 VDS): each dataset of the parts' files, stacked in
    part order, by paths relative to the merged file."""

    names: tuple[str, ...] = (FILE_NAME,)

    def build(self, store: Store, parts: list[Manifest], dirs: list[str],
              schema: Schema) -> Built:
        total = sum(m.num_samples for m in parts)
        with tempfile.TemporaryDirectory(prefix="feedpipe-merge-") as tmp:  # remote: fetched
            files = []
            try:
                for d in dirs:
                    files.append(h5py.File(store.local(f"{d}/{FILE_NAME}", Path(tmp)), "r"))
                layouts = {name: _stack(name, files, parts, dirs, total) for name in files[0]}
            finally:
                for f in files:
                    f.close()

        # the merged file's dataset id: its parts' ids, in order (see DatasetWriter.dataset_id)
        merged_id = hashlib.blake2b("\n".join(str(m.extra.get("dataset_id")) for m in parts)
                                    .encode(), digest_size=16).hexdigest()

        def write(fh: BinaryIO) -> None:
            with h5py.File(fh, "w") as out:
                for name, layout in layouts.items():
                    out.create_virtual_dataset(name, layout)
                out.attrs["num_samples"] = total
                out.attrs[ID_ATTR] = np.bytes_(merged_id)

        return [_write(store, FILE_NAME, write)], {"compression": parts[0].extra.get("compression"),
                                          "dataset_id": merged_id}


def _stack(name: str, files: list[h5py.File], parts: list[Manifest], dirs: list[str],
           total: int) -> h5py.VirtualLayout:
    """The virtual layout of dataset ``name``: the parts' datasets stacked in part order."""
    first = files[0][name]
    srcs = [f.get(name) for f in files]
    for d, s in zip(dirs, srcs):
        if s is None or s.dtype != first.dtype or s.shape[1:] != first.shape[1:]:
            raise PartsError(f"{d}/{FILE_NAME}: dataset {name!r} is missing or differs from "
                             f"the first part's ({first.dtype}, {first.shape[1:]})")
    layout = h5py.VirtualLayout(shape=(total, *first.shape[1:]), dtype=first.dtype)
    at = 0
    for d, s, m in zip(dirs, srcs, parts):
        if s.shape[0] != m.num_samples:
            raise PartsError(f"{d}/{FILE_NAME}: dataset {name!r} has {s.shape[0]} rows, its "
                             f"manifest says {m.num_samples} samples")
        layout[at: at + m.num_samples] = h5py.VirtualSource(f"{d}/{FILE_NAME}", name,
                                                            shape=s.shape)
        at += m.num_samples
    return layout


BUILDERS: dict[str, Builder] = {"wds": WdsMerge(), "lmdb": LmdbMerge(), "hdf5": Hdf5Merge()}

