"""A FIFO (or a folder, a device) in place of a dataset file would block every open or read
forever: it is refused by name when the manifest is read, before anything is opened. Only
``Manifest.read`` runs here, which never opens a data file, so a regression fails instead of
hanging; tests/faults/test_fault_fifo.py runs verify and make_loader themselves."""

from __future__ import annotations

import os

import pytest

from feedpipe.dataset.manifest import Manifest
from feedpipe.errors import DamagedDataError

SPOTS = [("lmdb", "data.mdb"), ("hdf5", "data.h5"), ("wds", "index-offsets.npy"),
         ("wds", "index-values.npy"), ("wds", "shard-000001.tar")]


@pytest.mark.parametrize(("fmt", "name"), SPOTS)
def test_fifo_in_place_of_a_data_file_is_refused(packed, copy_dataset, fmt, name):
    root = copy_dataset(packed[fmt])
    (root / name).unlink()
    os.mkfifo(root / name)
    with pytest.raises(DamagedDataError, match=rf"'{name}' is a FIFO .*not a regular file") as e:
        Manifest.read(root)
    assert isinstance(e.value, DamagedDataError) and e.value.file == str(root / name)


def test_a_folder_or_a_link_to_a_fifo_is_refused(packed, copy_dataset):
    root = copy_dataset(packed["lmdb"])
    (root / "data.mdb").unlink()
    (root / "data.mdb").mkdir()
    with pytest.raises(DamagedDataError, match="'data.mdb' is a folder"):
        Manifest.read(root)
    (root / "data.mdb").rmdir()
    os.mkfifo(root / "pipe")
    os.symlink("pipe", root / "data.mdb")  # a link inside the dataset: followed, then refused
    with pytest.raises(DamagedDataError, match="'data.mdb' is a FIFO"):
        Manifest.read(root)
