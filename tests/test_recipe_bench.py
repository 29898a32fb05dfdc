"""benchmarks/peers/tv_recipe.py: the hand-written torchvision v2 ImageNet recipe that the
DataLoader side of bench_recipe.py and of the peers' ``--recipe imagenet`` runs (no torchvision
here). Its colour jitter must be the same operation as feedpipe's built-in ColorJitter (up to v2's
uint8 truncation after each step), or the comparison would not be like for like."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from feedpipe.loader.augment import ColorJitter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "peers"))
import tv_recipe  # noqa: E402


@pytest.fixture
def photo():
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, 320)[None, :, None] * np.array([1.0, 0.6, 0.3])
    img = np.clip(ramp + rng.normal(0, 20, (240, 320, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(img)


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [2, 3, 1, 0], [3, 1, 0, 2]])
def test_its_color_jitter_is_feedpipes_up_to_v2_truncation(photo, order):
    x = torch.from_numpy(np.array(photo)).permute(2, 0, 1).contiguous()
    factors = [1.3, 0.7, 1.4]
    got = tv_recipe.color_jitter(x, order, factors).int()
    active = [i for i in order if i < 3]
    params = {name: torch.tensor([f], dtype=torch.float64)
              for name, f in zip(("brightness", "contrast", "saturation"), factors, strict=True)}
    params["order"] = torch.tensor([active])
    want = ColorJitter(0.4, 0.4, 0.4).apply({"image": x[None]}, params)["image"][0].int()
    diff = (got - want).abs()
    # v2 truncates to uint8 after each step (and floors the luma): ~0.5 level a step, amplified
    # by later factors > 1; feedpipe rounds once at the end
    assert diff.max() <= 4 and diff.float().mean() < 2
    assert not torch.equal(got, x.int())


def test_the_recipe_gives_normalized_224_crops_and_erases_with_zero(photo):
    recipe = tv_recipe.Recipe(224)
    torch.manual_seed(0)
    outs = [recipe(photo) for _ in range(24)]
    assert all(o.dtype == torch.float32 and o.shape == (3, 224, 224) for o in outs)
    assert all(-2.2 < float(o.min()) and float(o.max()) < 2.7 for o in outs)  # normalized range
    erased = [o for o in outs if bool((o == 0).all(0).sum() > 100)]
    assert 0 < len(erased) < len(outs)  # p = 0.25 of 24 draws
    torch.manual_seed(0)
    assert torch.equal(recipe(photo), outs[0])  # torch's global generator, as torchvision


def test_the_user_function_is_reproducible_from_its_rng(photo):
    base = torch.from_numpy(np.array(photo)[:224, :224]).permute(2, 0, 1)
    a, b, c = (base.clone() for _ in range(3))
    tv_recipe.user_augment({"image": a}, np.random.default_rng(5))
    tv_recipe.user_augment({"image": b}, np.random.default_rng(5))
    tv_recipe.user_augment({"image": c}, np.random.default_rng(6))
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, base)
