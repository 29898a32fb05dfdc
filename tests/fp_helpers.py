"""Helpers shared by the test modules; module-level so that spawn-started workers can import them."""

from __future__ import annotations

import io
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from torch.utils.data import Dataset

from feedpipe import Output
from feedpipe.dataset.registry import DatasetReader

CLI = [sys.executable, "-m", "feedpipe.cli"]
# converters.progressive's transform (the turbojpeg package) has wheels for x86_64 Linux, macOS,
# Windows and CPython <= 3.13 only (pyproject.toml); where it has one, a test needing it fails if
# it is missing rather than skip
needs_transform = pytest.mark.skipif(
    sys.version_info >= (3, 14) or (sys.platform == "linux" and platform.machine() != "x86_64"),
    reason="the turbojpeg package has no wheel for this platform")


class ReaderDataset(Dataset):
    """A minimal map-style torch Dataset over an opened feedpipe reader (picklable with it)."""

    def __init__(self, reader: DatasetReader) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, i: int) -> dict[str, Any]:
        s = self.reader[i]
        return {"index": i, "label": int(s["label"]), "sum": int(s["image"].astype(np.int64).sum()),
                "path": s["path"], "pid": os.getpid(),
                "opened_in": self.reader._pid}  # the process whose handles served the read


def collate_list(batch: list[Any]) -> list[Any]:
    """Keep samples as they are (the default collate would tensorize the path strings)."""
    return batch


def jpeg_bytes(arr: np.ndarray, **save: Any) -> bytes:
    """Encode an array (or PIL mode conversion of it) as JPEG with Pillow."""
    out = io.BytesIO()
    Image.fromarray(arr).save(out, "JPEG", **save)
    return out.getvalue()


def pil_rgb(path_or_bytes: Path | bytes) -> np.ndarray:
    """Reference decode: Pillow, converted to RGB (no EXIF handling)."""
    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with Image.open(src) as img:
        return np.asarray(img.convert("RGB"))


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.int32) - b.astype(np.int32)).mean())


def flip_byte(path: Path, offset: int) -> None:
    """XOR one byte of a file in place."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def rerecord(root: Path) -> Path:
    """Record a dataset's data files as they now are (sizes and SHA-256s) in its manifest: what
    a forger who edits a data file does, to get past the size check at open."""
    import json

    from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry

    d = json.loads((root / MANIFEST_NAME).read_text())
    d["files"] = [vars(FileEntry.of(root, f["name"])) for f in d["files"]]
    (root / MANIFEST_NAME).write_text(json.dumps(d))
    return root


def put_hdf5_value(root: Path, name: str, index: int, data: bytes) -> Path:
    """Store ``data`` as field ``name`` of sample ``index`` in an HDF5 dataset, with its
    checksum (a damaged record the checksum cannot catch), and re-record the file."""
    import zlib

    import h5py

    from feedpipe.dataset.manifest import Manifest

    col = Manifest.read(root).schema.names.index(name)
    with h5py.File(root / "data.h5", "r+") as f:
        off, blob = f[f"{name}__offsets"][:], f[name][:]
        a, b = int(off[index]), int(off[index + 1])
        off[index + 1:] += len(data) - (b - a)
        for key, value in ((name, np.concatenate([blob[:a], np.frombuffer(data, np.uint8),
                                                  blob[b:]])), (f"{name}__offsets", off)):
            del f[key]
            f[key] = value
        f["_feedpipe.crc32"][index, col] = zlib.crc32(data)
    return rerecord(root)


def cli_main(capsys, *args: str | os.PathLike[str]) -> tuple[int, str, str]:
    """Run the CLI's ``main`` in this process (no interpreter start-up); (exit code, out, err)."""
    from feedpipe.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def run_cli(*args: str | os.PathLike[str], timeout: float = 120,
            check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``python -m feedpipe.cli ARGS`` and capture its output."""
    proc = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    if check:
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def free_port() -> int:
    """A TCP port nothing listens on now (for torchrun's rendezvous: fixed ports collide)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def downgrade_to_v1(root: Path, fmt: str) -> Path:
    """Rewrite a packed LMDB dataset in place as format version 1 (records without checksums),
    the layout datasets written before checksums hold. A WebDataset's or HDF5 dataset's manifest
    only is marked version 1: feedpipe refuses it before reading any other file."""
    import json
    import struct

    import lmdb

    from feedpipe.dataset.manifest import MANIFEST_NAME, FileEntry
    from feedpipe.schema.codecs import unpack_record

    d = json.loads((root / MANIFEST_NAME).read_text())
    n = len(d["schema"])
    if fmt == "lmdb":
        env = lmdb.open(str(root), subdir=True,
                        map_size=4 * (root / "data.mdb").stat().st_size + (1 << 20))
        with env.begin(write=True) as txn:
            for key, value in list(txn.cursor()):
                if key == b"feedpipe.dataset_id":  # no record
                    continue
                parts = [bytes(p) for p in unpack_record(value, n)]
                txn.put(key, b"".join([b"FPR1", struct.pack(f"<I{n}I", n, *map(len, parts)),
                                       *parts]))
        env.close()
        (root / "lock.mdb").unlink()
    d["format_version"] = 1
    d["files"] = [vars(FileEntry.of(root, f["name"])) for f in d["files"]]
    (root / MANIFEST_NAME).write_text(json.dumps(d))
    return root


def loader_batches(source: Any, **kw: Any) -> list[dict[str, Any]]:
    """Every batch of ``make_loader(source, 8, **kw)``, its tensors only (for comparing)."""
    import torch

    import feedpipe

    return [{k: v for k, v in b.items() if isinstance(v, torch.Tensor)}
            for b in feedpipe.make_loader(source, 8, **kw)]


def same_batches(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Whether two batch lists hold the same tensors, batch by batch."""
    import torch

    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k])
                                                                   for k in x)
                                    for x, y in zip(a, b, strict=True))


def batch_digests(batches: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The SHA-256 of each tensor of each batch (batches compared across processes)."""
    import hashlib

    return [{k: hashlib.sha256(v.numpy().tobytes()).hexdigest() for k, v in b.items()}
            for b in batches]


def data_files(root: Path) -> dict[str, int]:
    """A packed dataset's data files (shards, ``data.mdb``, ``data.h5``; not the manifest or
    index files) by name, with their sizes: what a remote read must fetch, once each."""
    import feedpipe

    return {f.name: f.size for f in feedpipe.open_dataset(root).manifest.files
            if not f.name.startswith("index-")}


#: the loader settings the remote-storage tests read a dataset with, remote and local alike
REMOTE_KW: dict[str, Any] = dict(size=48, device="cpu", seed=5, num_workers=0,
                                 output=Output(dtype="uint8"))


def remote_batches(source: Any, **extra: Any) -> list[dict[str, Any]]:
    """:func:`loader_batches` with :data:`REMOTE_KW` (``extra`` overrides them)."""
    return loader_batches(source, **{**REMOTE_KW, **extra})
