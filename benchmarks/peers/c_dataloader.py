"""Contender: a hand-tuned torch DataLoader over the loose JPEG files, decoded with PIL.

What a careful user writes without any data library, following the PyTorch data loading docs
(https://docs.pytorch.org/docs/stable/data.html — map-style Dataset, ``num_workers``,
``persistent_workers``, ``prefetch_factor``, ``worker_init_fn``) and the torchvision ImageNet
recipe (``Resize(224)`` + ``CenterCrop(224)`` + ``PILToTensor``, written out in
common.pil_resize_center_crop since there is no CPU torchvision here). Hand-tuning: 2 persistent
workers with one torch thread each, prefetch 4, and PIL's ``draft`` so big JPEGs decode at a DCT
scale that still covers the output (no effect on photos under 2x the output size).
No packing: the "index" is the list of (path, label).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import load_items, one_thread, pil_resize_center_crop, serve
from PIL import Image
from torch.utils.data import DataLoader, Dataset


class LooseJpegs(Dataset):
    """One PIL decode per sample; default collate stacks the C×H×W uint8 tensors."""

    def __init__(self, items: list[tuple[str, int]], size: int) -> None:
        self.items, self.size = items, size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        with Image.open(path) as im:
            im.draft("RGB", (self.size, self.size))
            arr = pil_resize_center_crop(im.convert("RGB"), self.size)
        return torch.from_numpy(arr).permute(2, 0, 1), label


def pack(items: list[tuple[str, int]], work: Path, args: argparse.Namespace) -> None:
    """Nothing to pack: the loader reads the source files."""


def tuned(dataset: Dataset, args: argparse.Namespace) -> DataLoader:
    """The DataLoader as its docs tune it: persistent workers, prefetch 4, one thread each (the
    same for the centre-crop and the recipe runs)."""
    return DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                      persistent_workers=True, prefetch_factor=4, worker_init_fn=one_thread)


def open_loader(work: Path, args: argparse.Namespace):
    loader = tuned(LooseJpegs(load_items(args.items), args.size), args)
    return lambda: loader


if __name__ == "__main__":
    serve("hand-tuned DataLoader", pack, open_loader)
