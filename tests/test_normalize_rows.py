"""Normalization over a channels-last batch's rows of W×C values (the fast CPU path) gives
exactly the values of the per-channel broadcast it replaces."""

from __future__ import annotations

import numpy as np
import torch

from feedpipe.loader.torch import cpu_convert

MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
INV_STD = 1 / (np.array([0.229, 0.224, 0.225], np.float32) * 255)


def test_numpy_rows_match_the_broadcast() -> None:
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 17, 23, 3), np.uint8))
    want = (x.numpy().astype(np.float32) - MEAN) * INV_STD
    got = cpu_convert.image(x, torch.float32, MEAN, INV_STD, channels_last=True)
    assert np.array_equal(got.permute(0, 2, 3, 1).numpy(), want)


def test_torch_rows_match_the_broadcast() -> None:
    x = torch.rand(3, 17, 23, 3, generator=torch.Generator().manual_seed(1)).permute(0, 3, 1, 2)
    mean = torch.from_numpy(MEAN).view(1, 3, 1, 1)
    inv = torch.from_numpy(INV_STD).view(1, 3, 1, 1)
    want = x.clone().sub_(mean).mul_(inv)
    rows = cpu_convert.rows_of(x)
    assert rows is not None and rows.shape == (3 * 17, 23 * 3)
    rows.sub_(mean.view(-1).repeat(23)).mul_(inv.view(-1).repeat(23))
    assert torch.equal(x, want)
    assert cpu_convert.rows_of(x.contiguous()) is None  # NCHW storage: no row view
