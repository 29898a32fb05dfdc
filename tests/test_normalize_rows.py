"""Normalization over a channels-last batch's rows of W×C values (the fast CPU path of
feedpipe/loader/torch/convert.py) gives exactly the values of the per-channel broadcast."""

from __future__ import annotations

import numpy as np
import torch

from feedpipe.loader.torch.convert import normalize

MEAN = torch.from_numpy(np.array([0.485, 0.456, 0.406], np.float32) * 255).view(1, 3, 1, 1)
INV_STD = torch.from_numpy(1 / (np.array([0.229, 0.224, 0.225], np.float32) * 255)).view(1, 3, 1,
                                                                                           1)


def test_rows_match_the_broadcast() -> None:
    x = torch.rand(3, 17, 23, 3, generator=torch.Generator().manual_seed(1)).permute(0, 3, 1, 2)
    assert x.is_contiguous(memory_format=torch.channels_last)  # the row view applies
    want = x.clone().sub_(MEAN).mul_(INV_STD)
    got = normalize(x, MEAN, INV_STD)
    assert got is x and torch.equal(x, want)


def test_nchw_storage_takes_the_broadcast() -> None:
    x = torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(2))
    want = (x - MEAN) * INV_STD
    assert torch.equal(normalize(x, MEAN, INV_STD), want)
