"""One geometry plan per sample: the CPU decoder, the nvJPEG path's workers and the
DALI backend's plan source execute the same ``Framing.plan`` for the same (seed, epoch, batch).

Real packed photos and the real executors' inputs: the CPU path's returned geometry and
pixels, the :class:`EncodedBatch` the workers ship to nvJPEG, and the windows ``PlanSource``
hands DALI's ``external_source``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import simplejpeg

import feedpipe
from feedpipe.loader.api import LoaderConfig
from feedpipe.loader.dali.pipeline import PlanSource
from feedpipe.loader.dataset import BatchDataset
from feedpipe.loader.geometry import Framing, Geometry
from feedpipe.loader.sampler import BatchRequest, PlanSampler, World, rng_for
from feedpipe.loader.transforms import ImageOp

SEED, EPOCH, NUMBER = 7, 2, 1


@pytest.mark.parametrize("crop", ["random_resized_crop", "center_crop"])
def test_three_executors_receive_the_same_plan(packed, crop):
    reader = feedpipe.open_dataset(packed["lmdb"])
    cfg = LoaderConfig(batch_size=16, size=24, crop=crop, flip=True, seed=SEED)
    framing = Framing.of(cfg)
    indices = PlanSampler(reader, cfg, World(0, 1)).plan(EPOCH)[NUMBER]
    rng = rng_for(SEED, EPOCH, 0, NUMBER)
    files = [bytes(reader.read_raw(int(i))["image"]) for i in indices]
    plans = [framing.plan(*simplejpeg.decode_jpeg_header(f)[:2], rng) for f in files]
    # the plans exercise every part: flips both ways, DCT downscales and (random) crop boxes
    assert {p.flip for p in plans} == {False, True} and max(p.dct for p in plans) > 1
    req = BatchRequest(indices, EPOCH, NUMBER, 0)

    # nvJPEG: the workers ship each sample's planned box and flip
    enc = BatchDataset(reader, ["image"], ImageOp.of(cfg), seed=SEED, on_error="raise",
                       encoded_images=True).__getitems__(req)["image"]
    assert enc.boxes.tolist() == [list(p[:4]) for p in plans]
    assert enc.flips.tolist() == [p.flip for p in plans]

    # DALI: PlanSource hands external_source the same windows and flips
    source = PlanSource(reader, cfg, World(0, 1), "image", framing, EPOCH, 0, windows=True)
    _, flips, anchors, shapes = source(SimpleNamespace(epoch_idx=0, iteration=NUMBER))
    assert [tuple(a) + tuple(s) for a, s in zip(anchors.tolist(), shapes.tolist(), strict=True)] \
        == [p[:4] for p in plans]
    assert flips.tolist() == [int(p.flip) for p in plans]

    # CPU: each sample's plan executed at its DCT scale (the box snapped to that grid), and
    # the batch the loader's dataset produces is exactly those executions
    op, cpu_rng = ImageOp.of(cfg), rng_for(SEED, EPOCH, 0, NUMBER)
    outs = np.empty((len(files), 24, 24, 3), np.uint8)
    done = [op.apply(f, "jpeg", outs[k], cpu_rng, "image") for k, f in enumerate(files)]
    assert done == [p.snapped(p.dct) for p in plans]
    batch = BatchDataset(reader, ["image"], op, seed=SEED, on_error="raise").__getitems__(req)
    assert np.array_equal(batch["image"].numpy(), outs)


def test_snapping_keeps_the_region_on_the_scaled_grid():
    geo = Geometry(13, 6, 101, 87, True, dct=4)
    assert geo.scaled(4) == (3, 1, 25, 21)
    assert geo.snapped(4) == Geometry(12, 4, 100, 84, True, dct=4)
    assert geo.snapped(1) == geo._replace(dct=1)


def test_crop_none_refuses_another_size_from_the_header():
    framing = Framing((24, 32), "none")
    framing.check_fits(24, 32, "x")
    with pytest.raises(ValueError, match="x: image is 30x24, batch is 32x24"):
        framing.check_fits(24, 30, "x")


def _torchvision_box(h: int, w: int, rng: np.random.Generator, scale: tuple[float, float],
                     ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` written with numpy's ``uniform`` and
    ``integers``: the draws ``Framing.box`` must reproduce bit for bit."""
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = h * w * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_r))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
    if w / h < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif w / h > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        ch, cw = h, w
    return (h - ch) // 2, (w - cw) // 2, ch, cw


@pytest.mark.parametrize("scale, ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 0.5), (1.0, 1.0)),
                                          ((0.9, 1.0), (2.5, 3.0))])
def test_random_resized_crop_draws_match_numpys_uniform(scale, ratio):
    """The box draws ``lo + (hi - lo) * random()`` in place of ``uniform(lo, hi)`` (a cheaper
    call): the same boxes and the same generator state after each, over many images, including
    the fallback centre crop when ten draws miss (a tall image against wide ratios)."""
    framing = Framing((224, 224), "random_resized_crop", scale=scale, ratio=ratio)
    sizes = [(375, 500), (853, 1280), (31, 7), (2000, 90), (224, 224)]
    ours, ref = rng_for(SEED, 0, 0, 0), rng_for(SEED, 0, 0, 0)
    for k in range(3000):
        h, w = sizes[k % len(sizes)]
        assert framing.box(h, w, ours) == _torchvision_box(h, w, ref, scale, ratio)
    assert ours.random() == ref.random()
