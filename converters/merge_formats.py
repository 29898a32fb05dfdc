"""What a merge writes per format, over the parts already inside the dataset (no data copied).

Each builder returns the merged files it wrote (as manifest entries) and the format's ``extra``;
all writing goes through the merge's store (:class:`converters.merge.LocalStore`).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Protocol

import h5py
import numpy as np

from feedpipe.dataset.formats.hdf5 import FILE_NAME, ID_ATTR
from feedpipe.dataset.formats.wds import CRC_FILE, INDEX_FILES, VALUES_FILE
from feedpipe.dataset.manifest import FileEntry, Manifest
from feedpipe.errors import PartsError
from feedpipe.schema.model import Schema

if TYPE_CHECKING:
    from .merge import LocalStore

Built = tuple[list[FileEntry], dict[str, Any]]


class Builder(Protocol):
    names: tuple[str, ...]  # the files it writes at the dataset's top level

    def build(self, store: LocalStore, parts: list[Manifest], dirs: list[str],
              schema: Schema) -> Built: ...


def _save(arr: np.ndarray) -> Callable[[BinaryIO], None]:
    def write(fh: BinaryIO) -> None:
        np.save(fh, arr, allow_pickle=False)
    return write


class WdsMerge:
    """One shard list (the parts' shards, in part order) and one index over them."""

    names: tuple[str, ...] = (*INDEX_FILES, CRC_FILE, VALUES_FILE)  # values: with index fields

    def build(self, store: LocalStore, parts: list[Manifest], dirs: list[str],
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
            arrays = [store.load(f"{d}/{n}") for n in INDEX_FILES]
            crc = store.load(f"{d}/{CRC_FILE}")
            arrays[1] = arrays[1].astype(np.int32) + len(shards)
            if kept:  # spans of index fields point into the packed values: shift them
                arrays[0] = np.array(arrays[0], np.int64)
                arrays[0][:, in_index, 0] += packed
                values.append(store.load(f"{d}/{VALUES_FILE}"))
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
        written = []
        for name, arr in zip(self.names, arrays):
            store.write(name, _save(arr))
            written.append(store.entry(name))
        return written, {"shards": shards, **({"index_fields": kept} if kept else {})}


class LmdbMerge:
    """Nothing to write: the reader opens the parts' environments (``extra.parts``) together."""

    names: tuple[str, ...] = ()

    def build(self, store: LocalStore, parts: list[Manifest], dirs: list[str],
              schema: Schema) -> Built:
        return [], {}


class Hdf5Merge:
    """``data.h5`` of virtual datasets (HDF5 VDS): each dataset of the parts' files, stacked in
    part order, by paths relative to the merged file."""

    names: tuple[str, ...] = (FILE_NAME,)

    def build(self, store: LocalStore, parts: list[Manifest], dirs: list[str],
              schema: Schema) -> Built:
        total = sum(m.num_samples for m in parts)
        files = [h5py.File(store.path(f"{d}/{FILE_NAME}"), "r") for d in dirs]
        try:
            layouts = {}
            for name in files[0]:
                first = files[0][name]
                srcs = [f.get(name) for f in files]
                for d, s in zip(dirs, srcs):
                    if s is None or s.dtype != first.dtype or s.shape[1:] != first.shape[1:]:
                        raise PartsError(f"{d}/{FILE_NAME}: dataset {name!r} is missing or "
                                         f"differs from the first part's ({first.dtype}, "
                                         f"{first.shape[1:]})")
                layout = h5py.VirtualLayout(shape=(total, *first.shape[1:]), dtype=first.dtype)
                at = 0
                for d, s, m in zip(dirs, srcs, parts):
                    if s.shape[0] != m.num_samples:
                        raise PartsError(f"{d}/{FILE_NAME}: dataset {name!r} has {s.shape[0]} "
                                         f"rows, its manifest says {m.num_samples} samples")
                    layout[at: at + m.num_samples] = h5py.VirtualSource(
                        f"{d}/{FILE_NAME}", name, shape=s.shape)
                    at += m.num_samples
                layouts[name] = layout
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

        store.write(FILE_NAME, write)
        return [store.entry(FILE_NAME)], {"compression": parts[0].extra.get("compression"),
                                          "dataset_id": merged_id}


BUILDERS: dict[str, Builder] = {"wds": WdsMerge(), "lmdb": LmdbMerge(), "hdf5": Hdf5Merge()}

