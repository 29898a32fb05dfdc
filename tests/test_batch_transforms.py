"""``make_loader(batch_transforms=[...])``: batch operations (feedpipe.loader.augment) on each
batch before normalization, seeded per (seed, epoch, rank, batch): the same batches for any
``num_workers``, exact resume, and exactly the operations applied to the plain batch by hand."""

from __future__ import annotations

import pytest
import torch

import feedpipe
from feedpipe import Output
from feedpipe.errors import ConfigError
from feedpipe.loader.augment import ColorJitter, MixUp, RandomErasing, RandomGrayscale
from feedpipe.loader.config import IMAGENET_MEAN, IMAGENET_STD
from feedpipe.loader.order import batch_seed

KW = dict(size=24, seed=5, device="cpu", crop="random_resized_crop", flip=True)
RECIPE = [ColorJitter(0.4, 0.4, 0.4), RandomGrayscale(0.2), RandomErasing(0.5)]


def epoch(path, **kw):
    return [{k: v.clone() for k, v in b.items()} for b in feedpipe.make_loader(path, 8, **kw)]


def reference(path):
    """Each batch of the plain uint8 epoch, operated on by RECIPE with the batch's own generator
    and then normalized: what the loader's recipe batches must be."""
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    plain = epoch(path, num_workers=0, output=Output(dtype="uint8"), **KW)
    for number, b in enumerate(plain):
        gen = torch.Generator().manual_seed(batch_seed(5, 0, 0, number))
        x = {"image": b["image"].float() / 255, "label": b["label"]}
        for op in RECIPE:
            x = op(x, gen)
        yield (x["image"] - mean) / std


def test_the_recipe_is_the_plain_batch_operated_on_then_normalized(packed):
    got = epoch(packed["lmdb"], batch_transforms=RECIPE, num_workers=0, **KW)
    for a, want in zip(got, reference(packed["lmdb"]), strict=True):
        assert torch.allclose(a["image"], want, atol=1e-5)
    untouched = epoch(packed["lmdb"], num_workers=0, **KW)
    assert all(not torch.allclose(a["image"], b["image"]) for a, b in zip(got, untouched, strict=True))


def test_same_batches_for_any_workers_and_after_a_resume(packed):
    ref = epoch(packed["hdf5"], batch_transforms=RECIPE, num_workers=0, **KW)
    two = epoch(packed["hdf5"], batch_transforms=RECIPE, num_workers=2, **KW)
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(ref, two, strict=True))
    ld = feedpipe.make_loader(packed["hdf5"], 8, batch_transforms=RECIPE, num_workers=2, **KW)
    it = iter(ld)
    for _ in range(4):
        next(it)
    again = feedpipe.make_loader(packed["hdf5"], 8, batch_transforms=RECIPE, num_workers=0,
                                 **KW)
    again.load_state_dict(ld.state_dict())
    rest = [b["image"].clone() for b in again]
    assert all(torch.equal(a, b["image"]) for a, b in zip(rest, ref[4:], strict=True)) and rest


def test_uint8_output_and_mixup_labels(packed):
    kw = {**KW, "output": Output(dtype="uint8")}
    for b in feedpipe.make_loader(packed["lmdb"], 8, num_workers=2, **kw,
                                  batch_transforms=[ColorJitter(0.3), MixUp(0.4, 4)]):
        assert b["image"].dtype == torch.uint8 and b["image"].shape[1:] == (3, 24, 24)
        assert b["label"].shape == (len(b["image"]), 4)
        assert torch.allclose(b["label"].sum(1), torch.ones(len(b["image"])))


def test_user_functions_and_refusals(packed):
    def halve(batch, gen):
        return {**batch, "image": batch["image"] * 0.5}

    half = epoch(packed["lmdb"], batch_transforms=[halve], num_workers=0,
                 output=Output(mean=None, std=None), **KW)
    full = epoch(packed["lmdb"], num_workers=0, output=Output(mean=None, std=None), **KW)
    assert all(torch.allclose(a["image"], b["image"] * 0.5) for a, b in zip(half, full, strict=True))
    with pytest.raises(ConfigError, match="batch_transforms="):
        feedpipe.make_loader(packed["lmdb"], 8, batch_transforms="jitter", **KW)
    with pytest.raises(ConfigError, match="DALI"):
        feedpipe.make_loader(packed["lmdb"], 8, batch_transforms=RECIPE, backend="dali", **KW)


def test_operated_images_are_normalized_in_unit_range_without_a_round_trip(packed, monkeypatch):
    """After the operations, images in [0, 1] are normalized with mean and 1/std in [0, 1] units:
    no pass scaling the batch back to 0..255 first (it cost a pass over every batch); the
    values are the float32 normalization of the operated batch."""
    scaled: list[float] = []
    mul_ = torch.Tensor.mul_
    monkeypatch.setattr(torch.Tensor, "mul_", lambda t, v, *a: (
        scaled.append(v) if isinstance(v, (int, float)) and v == 255 else None,
        mul_(t, v, *a))[1])
    got = epoch(packed["lmdb"], batch_transforms=RECIPE, num_workers=0, **KW)
    assert got and not scaled
    for a, want in zip(got, reference(packed["lmdb"]), strict=True):
        assert torch.allclose(a["image"], want, atol=2e-6)
