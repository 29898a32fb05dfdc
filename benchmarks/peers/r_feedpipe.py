"""Recipe contender (``run.py --recipe imagenet``): feedpipe as c_feedpipe.py packs it, read with
the recipe from its built-in operations: ``crop="random_resized_crop", flip=True`` in the workers,
``batch_transforms=[ColorJitter(0.4, 0.4, 0.4), RandomErasing(0.25, value=IMAGENET_MEAN)]`` and
the ImageNet normalization (the default ``dtype="float32"``) on the batch. Erasing with the mean
colour before normalizing is torchvision's erasing with 0 after it."""

from __future__ import annotations

import argparse
from pathlib import Path

from c_feedpipe import _fmt, epochs, pack
from common import serve

import feedpipe
from feedpipe.loader.augment import ColorJitter, RandomErasing
from feedpipe.loader.config import IMAGENET_MEAN


def open_loader(work: Path, args: argparse.Namespace):
    return epochs(feedpipe.make_loader(
        work, args.batch, size=args.size, crop="random_resized_crop", flip=True, device="cpu",
        num_workers=args.workers, shuffle=True,
        batch_transforms=[ColorJitter(0.4, 0.4, 0.4), RandomErasing(0.25, value=IMAGENET_MEAN)]))


if __name__ == "__main__":
    serve(f"feedpipe {_fmt()}, ImageNet recipe", pack, open_loader)
