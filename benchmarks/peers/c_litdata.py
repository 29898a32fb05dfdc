"""Contender: LitData 0.2 (``optimize`` into chunks, ``StreamingDataset`` + ``StreamingDataLoader``).

Docs followed: the README quick start (https://github.com/Lightning-AI/litdata, "Optimize data":
``ld.optimize(fn=..., inputs=..., output_dir=..., chunk_bytes="64MB")`` with a PIL image in the
sample) and "Custom data transforms" (https://lightning.ai/docs/litdata/features/custom-data-transforms:
subclass ``StreamingDataset`` and transform in ``__getitem__`` with torchvision.transforms.v2).
Opening the source file with ``Image.open`` makes LitData store the original JPEG bytes; it
decodes them with ``torchvision.io.decode_jpeg``, provided here by the shim in shims/torchvision
(simplejpeg, libjpeg-turbo). The transform is v2's ``Resize(224, antialias=True)`` +
``CenterCrop(224)`` on the uint8 tensor (common.tensor_resize_center_crop).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import litdata as ld
import torch
from PIL import Image

from common import serve, tensor_resize_center_crop


def to_sample(item: tuple[str, int]) -> dict:
    path, label = item
    return {"image": Image.open(path), "label": label}


class CroppedImages(ld.StreamingDataset):
    """The docs' pattern: the transform in ``__getitem__``."""

    size = 224

    def __getitem__(self, index):
        sample = super().__getitem__(index)
        return tensor_resize_center_crop(sample["image"], self.size), sample["label"]


def pack(items: list[tuple[str, int]], work: Path, args: argparse.Namespace) -> None:
    if work.exists():
        shutil.rmtree(work)
    ld.optimize(fn=to_sample, inputs=items, output_dir=str(work), chunk_bytes="64MB",
                num_workers=args.workers, mode="overwrite")


def open_loader(work: Path, args: argparse.Namespace):
    CroppedImages.size = args.size
    dataset = CroppedImages(str(work), shuffle=True)
    loader = ld.StreamingDataLoader(dataset, batch_size=args.batch, num_workers=args.workers,
                                    persistent_workers=True)

    def epoch():
        for images, labels in loader:
            yield images, torch.as_tensor(labels)
    return epoch


if __name__ == "__main__":
    serve("LitData", pack, open_loader)
