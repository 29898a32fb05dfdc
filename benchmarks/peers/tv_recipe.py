"""The standard ImageNet training recipe the way torchvision's docs recommend it, without torchvision.

torchvision is not installed on the benchmark machines (no CPU wheel for this torch), so the
recipe of its reference scripts and of the v2 "performance considerations" (decode to a uint8
tensor, v2 transforms on uint8 tensors, ``ToDtype(float32, scale=True)`` late, bilinear
antialiased resize) is written out here with PIL and torch, following torchvision 0.2x's v2
functionals line by line: their parameter draws (torch's global generator, per call), their
formulas and their uint8 truncation after each colour step::

    v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(224, antialias=True),
                v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4),
                v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD),
                v2.RandomErasing(0.25)])

Used by the hand-tuned DataLoader of ``benchmarks/bench_recipe.py`` and of the peers harness's
``--recipe imagenet``. Its ColorJitter and RandomErasing also make the per-sample user function
(:func:`user_augment`) that bench_recipe runs through ``make_loader(transform=...)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
JITTER = 0.4  # ColorJitter(0.4, 0.4, 0.4): factors in [0.6, 1.4]
ERASE_P, ERASE_SCALE, ERASE_RATIO = 0.25, (0.02, 0.33), (0.3, 3.3)
RRC_SCALE, RRC_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def rrc_params(h: int, w: int, uniform, randint) -> tuple[int, int, int, int]:
    """v2.RandomResizedCrop's box (top, left, height, width): 10 tries, then the centre fallback."""
    area, log_ratio = h * w, (math.log(RRC_RATIO[0]), math.log(RRC_RATIO[1]))
    for _ in range(10):
        target = area * uniform(*RRC_SCALE)
        aspect = math.exp(uniform(*log_ratio))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return randint(0, h - ch + 1), randint(0, w - cw + 1), ch, cw
    in_ratio = w / h
    if in_ratio < min(RRC_RATIO):
        cw, ch = w, int(round(w / min(RRC_RATIO)))
    elif in_ratio > max(RRC_RATIO):
        ch, cw = h, int(round(h * max(RRC_RATIO)))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def _blend(img: torch.Tensor, other: torch.Tensor | float, ratio: float) -> torch.Tensor:
    """v2's ``_blend``: ratio·img + (1 - ratio)·other, clamped; uint8 truncated back."""
    out = img.mul(ratio).add_(other, alpha=1.0 - ratio).clamp_(0, 255)
    return out.to(img.dtype)


def _gray_floor(img: torch.Tensor) -> torch.Tensor:
    """v2's ``_rgb_to_grayscale_image(preserve_dtype=False)`` then ``floor_`` (uint8 input)."""
    r, g, b = img.unbind(-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).floor_().unsqueeze(-3)


def color_jitter(img: torch.Tensor, order: list[int], factors: list[float]) -> torch.Tensor:
    """v2.ColorJitter on a uint8 C×H×W tensor: brightness, contrast, saturation (0, 1, 2) applied
    in ``order`` with ``factors`` (hue, 3, is off: skipped as v2 skips a None factor)."""
    for i in order:
        f = factors[i] if i < 3 else None
        if f is None:
            continue
        if i == 0:
            img = img.mul(f).clamp_(0, 255).to(img.dtype)
        elif i == 1:
            img = _blend(img, _gray_floor(img).mean(dim=(-3, -2, -1), keepdim=True), f)
        else:
            img = _blend(img, _gray_floor(img), f)
    return img


def erase_params(h: int, w: int, uniform, randint, rand) -> tuple[int, int, int, int] | None:
    """v2.RandomErasing's draw: applied with probability p, then 10 tries for a box that fits."""
    if rand() >= ERASE_P:
        return None
    area, log_ratio = h * w, (math.log(ERASE_RATIO[0]), math.log(ERASE_RATIO[1]))
    for _ in range(10):
        erase_area = area * uniform(*ERASE_SCALE)
        aspect = math.exp(uniform(*log_ratio))
        eh, ew = int(round(math.sqrt(erase_area * aspect))), int(round(math.sqrt(erase_area / aspect)))
        if eh < h and ew < w:
            return randint(0, h - eh + 1), randint(0, w - ew + 1), eh, ew
    return None


def _t_uniform(lo: float, hi: float) -> float:
    return float(torch.empty(1).uniform_(lo, hi))


def _t_randint(lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (1,)))


def _t_rand() -> float:
    return float(torch.rand(1))


class Recipe:
    """The whole per-sample recipe on a PIL image: returns the normalized float32 C×S×S tensor.
    Draws from torch's global generator, as torchvision's transforms do (DataLoader seeds it per
    worker)."""

    def __init__(self, size: int = 224) -> None:
        self.size = size
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __call__(self, im: Image.Image) -> torch.Tensor:
        x = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)  # v2.PILToTensor (copies)
        h, w = x.shape[-2:]
        top, left, ch, cw = rrc_params(h, w, _t_uniform, _t_randint)
        # v2.resize on uint8 CPU tensors: channels-last for torch's AVX2 uint8 bilinear kernel
        crop = x[:, top: top + ch, left: left + cw].unsqueeze(0)
        x = F.interpolate(crop.contiguous(memory_format=torch.channels_last),
                          size=(self.size, self.size), mode="bilinear", antialias=True,
                          align_corners=False)[0]
        if _t_rand() < 0.5:  # RandomHorizontalFlip
            x = x.flip(-1)
        order = torch.randperm(4).tolist()
        factors = [_t_uniform(1 - JITTER, 1 + JITTER) for _ in range(3)]
        x = color_jitter(x.contiguous(), order, factors)
        x = x.float().div_(255).sub_(self.mean).div_(self.std)  # ToDtype(scale) + Normalize
        box = erase_params(self.size, self.size, _t_uniform, _t_randint, _t_rand)
        if box is not None:
            t, le, eh, ew = box
            x[:, t: t + eh, le: le + ew] = 0.0  # value 0: the mean colour once normalized
        return x


MEAN_LEVELS = tuple(round(255 * m) for m in MEAN)  # erasing before normalization: the mean colour


def user_augment(sample: dict, rng: np.random.Generator) -> None:
    """``make_loader(transform=...)``'s user function: the recipe's ColorJitter and RandomErasing
    (the same v2 formulas) on the sample's uint8 C×H×W image view, in place, drawing from the
    sample's ``rng``; crop, flip and normalization are the loader's own."""
    img = sample["image"]
    order = rng.permutation(4).tolist()
    factors = rng.uniform(1 - JITTER, 1 + JITTER, 3).tolist()
    out = color_jitter(img, order, factors)
    h, w = img.shape[-2:]
    box = erase_params(h, w, lambda a, b: float(rng.uniform(a, b)),
                       lambda a, b: int(rng.integers(a, b)), lambda: float(rng.random()))
    if box is not None:
        t, le, eh, ew = box
        out[:, t: t + eh, le: le + ew] = torch.tensor(MEAN_LEVELS, dtype=out.dtype).view(3, 1, 1)
    img.copy_(out)


def no_op(sample: dict, rng: np.random.Generator) -> None:
    """A ``transform`` that does nothing: what the hook itself costs per sample."""
