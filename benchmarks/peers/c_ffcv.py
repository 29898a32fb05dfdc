"""Contender: FFCV 1.0 (``.beton`` written by ``DatasetWriter`` with its JPEG field; its Loader).

Docs followed: Quickstart (https://docs.ffcv.io/quickstart.html), "Writing a dataset to FFCV
format" (https://docs.ffcv.io/writing_datasets.html), "Working with Image Data in FFCV"
(https://docs.ffcv.io/working_with_images.html) and the decoders API
(https://docs.ffcv.io/api/decoders.html). Writing: ``RGBImageField(write_mode="jpg",
jpeg_quality=90)`` from an indexed dataset of (PIL image, label); FFCV re-encodes every image
with OpenCV at that quality (it cannot keep the source bytes). ``max_resolution`` is left unset
so FFCV decodes images of the same size as everyone else (its ImageNet example shrinks them at
write time, which would be a different task). Reading: ``Loader(..., num_workers=2,
order=OrderOption.RANDOM, os_cache=True, drop_last=False)`` with
``CenterCropRGBImageDecoder((224, 224), ratio=1.0)`` (the full shorter side, as the task's centre
crop), ``ToTensor()``, ``ToTorchImage()``; labels ``IntDecoder()``, ``ToTensor()``,
``Squeeze()``. FFCV's workers are threads in this one process (numba), decoding with its own
libjpeg-turbo path (crop in the DCT domain where it can) and resizing with OpenCV's INTER_AREA.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ffcv.fields import IntField, RGBImageField
from ffcv.fields.decoders import CenterCropRGBImageDecoder, IntDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.transforms import Squeeze, ToTensor, ToTorchImage
from ffcv.writer import DatasetWriter
from PIL import Image

from common import serve


class PilImages:
    """The indexed dataset FFCV's writer takes: (PIL image, label) per index."""

    def __init__(self, items: list[tuple[str, int]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        path, label = self.items[i]
        return Image.open(path).convert("RGB"), label


def pack(items: list[tuple[str, int]], work: Path, args: argparse.Namespace) -> None:
    work.mkdir(parents=True, exist_ok=True)
    beton = work / "data.beton"
    beton.unlink(missing_ok=True)
    writer = DatasetWriter(str(beton), {"image": RGBImageField(write_mode="jpg", jpeg_quality=90),
                                        "label": IntField()}, num_workers=args.workers)
    writer.from_indexed_dataset(PilImages(items))


def open_loader(work: Path, args: argparse.Namespace):
    size = args.size
    loader = Loader(str(work / "data.beton"), batch_size=args.batch, num_workers=args.workers,
                    order=OrderOption.RANDOM, os_cache=True, drop_last=False,
                    pipelines={"image": [CenterCropRGBImageDecoder((size, size), ratio=1.0),
                                         ToTensor(), ToTorchImage()],
                               "label": [IntDecoder(), ToTensor(), Squeeze()]})
    return lambda: loader


if __name__ == "__main__":
    serve("FFCV", pack, open_loader)
