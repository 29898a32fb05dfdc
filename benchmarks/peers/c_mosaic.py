"""Contender: Mosaic Streaming 0.13 (``MDSWriter`` shards, ``StreamingDataset`` + DataLoader).

Docs followed: the Quick Start (https://docs.mosaicml.com/projects/streaming/en/stable/getting_started/quick_start.html):
``MDSWriter(out=..., columns={"img": "jpeg", "clf": "int"})``, then a ``StreamingDataset`` with
``batch_size`` given to both it and the torch ``DataLoader``; transforms in a subclass's
``__getitem__`` as its vision datasets (``streaming.vision``) do. No compression: JPEG bytes do
not compress, and the local shards are read in place (``local=``, no ``remote``). Passing the
``Image.open`` result makes the "jpeg" encoding store the original file bytes; it decodes to a PIL
image, transformed as torchvision's ``Resize(224)`` + ``CenterCrop(224)`` + ``PILToTensor``
(common.pil_resize_center_crop). Mosaic imports torchvision at import time: the shim in
shims/torchvision provides the two names (import-only).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from PIL import Image
from streaming import MDSWriter, StreamingDataset
from streaming.base.util import clean_stale_shared_memory
from torch.utils.data import DataLoader

from common import pil_resize_center_crop, serve


class CroppedImages(StreamingDataset):
    size = 224

    def __getitem__(self, index):
        sample = super().__getitem__(index)
        arr = pil_resize_center_crop(sample["image"].convert("RGB"), self.size)
        return torch.from_numpy(arr).permute(2, 0, 1), sample["label"]


def pack(items: list[tuple[str, int]], work: Path, args: argparse.Namespace) -> None:
    if work.exists():
        shutil.rmtree(work)
    with MDSWriter(out=str(work), columns={"image": "jpeg", "label": "int"}) as out:
        for path, label in items:
            with Image.open(path) as im:
                out.write({"image": im, "label": label})


def open_loader(work: Path, args: argparse.Namespace):
    clean_stale_shared_memory()
    CroppedImages.size = args.size
    dataset = CroppedImages(local=str(work), shuffle=True, batch_size=args.batch)
    loader = DataLoader(dataset, batch_size=args.batch, num_workers=args.workers,
                        persistent_workers=True)
    return lambda: loader


if __name__ == "__main__":
    serve("Mosaic Streaming", pack, open_loader)
