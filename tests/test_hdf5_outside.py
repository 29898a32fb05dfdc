"""An HDF5 dataset never reads a file outside itself: a ``data.h5`` whose dataset keeps its data
in an external file, whose name is an external link, or which is a virtual dataset (even one
whose source lies inside the dataset: feedpipe writes none, a merge reads its parts' files), is
refused by name before anything is read, by ``verify`` and the loader alike; a FIFO as the
outside file proves it is never even opened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from fp_helpers import rerecord
from test_writers import write_dataset

import feedpipe
from feedpipe import Workers
from feedpipe.dataset.verify import verify
from feedpipe.errors import DamagedDataError
from feedpipe.schema.fields import ImageField, JsonField, LabelField
from feedpipe.schema.model import Schema

SCHEMA = Schema((ImageField("image", "raw", (4, 4, 3)), LabelField("label"), JsonField("path")))
N = 2  # two 4×4 RGB images: 96 bytes
SECRET = bytes(range(96))  # the outside file's bytes, never to be served as pixels


def samples(k: int = 0) -> list[dict]:
    return [{"image": np.full((4, 4, 3), 10 * i + k, np.uint8), "label": i, "path": f"{i}.png"}
            for i in range(N)]


def dataset(root: Path, k: int = 0) -> Path:
    return write_dataset("hdf5", root, samples(k), SCHEMA)


def external_storage(root: Path, outside: Path) -> None:
    with h5py.File(root / "data.h5", "r+") as f:
        del f["image"]
        f.create_dataset("image", shape=(N, 4, 4, 3), dtype=np.uint8,
                         external=[(str(outside), 0, 96)])


def external_link(root: Path, outside: Path) -> None:
    with h5py.File(root / "data.h5", "r+") as f:
        del f["image"]
        f["image"] = h5py.ExternalLink(str(outside), "/image")


def virtual_source_with_external_storage(root: Path, outside: Path) -> None:
    """A virtual ``label`` whose source lies inside the dataset, but keeps its data outside."""
    part = root / "parts" / "p"
    part.mkdir(parents=True)
    with h5py.File(part / "data.h5", "w") as f:
        f.create_dataset("label", shape=(N,), dtype=np.int64, external=[(str(outside), 0, 16)])
    layout = h5py.VirtualLayout(shape=(N,), dtype=np.int64)
    layout[:] = h5py.VirtualSource("parts/p/data.h5", "label", shape=(N,))
    with h5py.File(root / "data.h5", "r+") as f:
        del f["label"]
        f.create_virtual_dataset("label", layout)


PLANTS = {"external storage": (external_storage, "image", "external file"),
          "external link": (external_link, "image", "external link"),
          "virtual source": (virtual_source_with_external_storage, "label", "virtual dataset")}


def outside(kind: str, tmp_path: Path) -> Path:
    """The file outside the dataset: raw bytes, or for a link another dataset's HDF5 file."""
    if kind == "external link":
        return dataset(tmp_path / "other", k=100) / "data.h5"
    path = tmp_path / "secret.bin"
    path.write_bytes(SECRET)
    return path


@pytest.mark.parametrize("kind", PLANTS)
def test_a_dataset_reaching_outside_is_refused_by_name(kind, tmp_path):
    plant, name, what = PLANTS[kind]
    root = dataset(tmp_path / "ds")
    target = outside(kind, tmp_path)
    plant(root, target)
    rerecord(root)  # the manifest forged to match: only the HDF5 file's own records can tell
    with pytest.raises(DamagedDataError, match=f"'{name}'.*{what}") as exc:
        feedpipe.open_dataset(root)[0]
    assert str(target) in str(exc.value) or kind == "virtual source"
    report = verify(root)
    assert not report.ok and any(f"'{name}'" in p and what in p for p in report.problems)
    for on_error in ("raise", "skip"):
        with pytest.raises(DamagedDataError, match=f"'{name}'"):
            next(iter(feedpipe.make_loader(root, 2, device="cpu", num_workers=0,
                                           fields=("image", "label"),
                                           workers=Workers(on_error=on_error))))


PROBE = """
import sys
import feedpipe
from feedpipe.dataset.verify import verify
from feedpipe.errors import DamagedDataError
print(verify(sys.argv[1]).problems)
try:
    feedpipe.open_dataset(sys.argv[1])[0]
except DamagedDataError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("kind", PLANTS)
def test_the_outside_file_is_never_opened(kind, tmp_path):
    """The outside file is a FIFO: opening it for reading would block until a writer comes (none
    does), so a run that ends shows nothing opened it. In a subprocess with a timeout."""
    plant, name, _ = PLANTS[kind]
    root = dataset(tmp_path / "ds")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    plant(root, fifo)
    rerecord(root)
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE, str(root)], capture_output=True,
                              text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{kind}: the FIFO outside the dataset was opened (the read blocked)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: " in proc.stdout and f"'{name}'" in proc.stdout, proc.stdout
