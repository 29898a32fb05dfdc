"""Readers inside torch DataLoader workers, started by fork and by spawn."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import N_PHOTOS
from fp_helpers import ReaderDataset, collate_list
from torch.utils.data import DataLoader

import feedpipe


@pytest.fixture(scope="module")
def expected(packed) -> dict:
    """(label, pixel sum, path) per index, computed in the main process with a separate reader."""
    out = {}
    for f, path in packed.items():
        ds = feedpipe.open_dataset(path)
        out[f] = [(s["label"], int(s["image"].astype(np.int64).sum()), s["path"]) for s in ds]
    return out


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_every_sample(packed, fmt, context, expected):
    reader = feedpipe.open_dataset(packed[fmt])
    reader[0]  # opened in the parent first: a forked worker must not reuse its handles
    loader = DataLoader(ReaderDataset(reader), batch_size=8, shuffle=False, num_workers=2,
                        multiprocessing_context=context, collate_fn=collate_list)
    got = [item for batch in loader for item in batch]
    assert sorted(g["index"] for g in got) == list(range(N_PHOTOS))  # every sample exactly once
    for g in got:
        assert (g["label"], g["sum"], g["path"]) == expected[fmt][g["index"]], g
        assert g["opened_in"] == g["pid"]  # handles (re)opened in the worker, not inherited
    pids = {g["pid"] for g in got}
    assert len(pids) == 2 and os.getpid() not in pids  # really read in two worker processes
    assert reader[N_PHOTOS - 1]["path"] == expected[fmt][-1][2]  # parent still reads fine


def test_dataloader_shuffled_with_persistent_workers(packed, expected):
    reader = feedpipe.open_dataset(packed["wds"])
    loader = DataLoader(ReaderDataset(reader), batch_size=5, shuffle=True, num_workers=2,
                        multiprocessing_context="fork", persistent_workers=True,
                        collate_fn=collate_list)
    for _ in range(2):  # two epochs through the same workers
        got = [item for batch in loader for item in batch]
        assert sorted(g["index"] for g in got) == list(range(N_PHOTOS))
        assert all((g["label"], g["sum"], g["path"]) == expected["wds"][g["index"]] for g in got)
