"""Recipe contender (``run.py --recipe imagenet``): FFCV packed as c_ffcv.py packs it, read with
its ImageNet example's training pipeline (https://github.com/libffcv/ffcv-imagenet, train_imagenet.py:
``RandomResizedCropRGBImageDecoder((224, 224))``, ``RandomHorizontalFlip()``, ``ToTensor()``,
``ToDevice``, ``ToTorchImage()``, ``NormalizeImage(mean, std, float32)``) plus FFCV's own nearest
equivalents of the rest (``ffcv.transforms``, numba-compiled, on the uint8 NHWC batch). On the
CPU, ``NormalizeImage`` is a numba operation on the NHWC numpy batch (a lookup table per channel),
so it goes before ``ToTensor`` (after ``ToTorchImage``, as the GPU example has it, the epoch hangs
on the CPU) and ``ToDevice`` is left out:

- ColorJitter(0.4, 0.4, 0.4): ``RandomBrightness(0.4, p=1)``, ``RandomContrast(0.4, p=1)``,
  ``RandomSaturation(0.4, p=1)``: the same factor ranges and formulas, per sample, but always in
  that order (torchvision draws a random order) and rounded to uint8 after each;
- RandomErasing(0.25): FFCV has none; ``Cutout`` blacks out a fixed square in every image. A 47 px
  square (4.4% of 224²) erases the same expected area as RandomErasing(0.25) with its area
  fractions 0.02-0.33 (0.25 × 0.175), filled with the mean colour (0 once normalized).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from c_ffcv import pack
from common import serve
from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.transforms import (
    Cutout,
    NormalizeImage,
    RandomBrightness,
    RandomContrast,
    RandomHorizontalFlip,
    RandomSaturation,
    Squeeze,
    ToTensor,
    ToTorchImage,
)

MEAN, STD = np.array([0.485, 0.456, 0.406]) * 255, np.array([0.229, 0.224, 0.225]) * 255
CUTOUT = 47  # px: RandomErasing(0.25)'s expected erased area, sqrt(0.25 * 0.175) * 224


def open_loader(work: Path, args: argparse.Namespace):
    size = args.size
    image = [RandomResizedCropRGBImageDecoder((size, size)), RandomHorizontalFlip(),
             RandomBrightness(0.4, p=1.0), RandomContrast(0.4, p=1.0),
             RandomSaturation(0.4, p=1.0),
             Cutout(round(CUTOUT * size / 224), tuple(int(round(m)) for m in MEAN)),
             NormalizeImage(MEAN, STD, np.float32), ToTensor(), ToTorchImage()]
    loader = Loader(str(work / "data.beton"), batch_size=args.batch, num_workers=args.workers,
                    order=OrderOption.RANDOM, os_cache=True, drop_last=False,
                    pipelines={"image": image,
                               "label": [IntDecoder(), ToTensor(), Squeeze()]})
    return lambda: loader


if __name__ == "__main__":
    serve("FFCV, ImageNet recipe", pack, open_loader)
