"""Recipe contender (``run.py --recipe imagenet``): the hand-tuned DataLoader of c_dataloader.py
with torchvision's ImageNet training recipe per sample (tv_recipe.Recipe: v2's RandomResizedCrop,
flip, ColorJitter(0.4, 0.4, 0.4), ToDtype + Normalize, RandomErasing(0.25), written out since
there is no torchvision here). No ``draft``: the crop box is random, and for these photos a DCT
scale that still covers a random 224² crop is rarely below full size."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from c_dataloader import pack, tuned
from common import load_items, serve
from PIL import Image
from torch.utils.data import Dataset
from tv_recipe import Recipe


class RecipeJpegs(Dataset):
    def __init__(self, items: list[tuple[str, int]], size: int) -> None:
        self.items, self.recipe = items, Recipe(size)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        with Image.open(path) as im:
            return self.recipe(im), label


def open_loader(work: Path, args: argparse.Namespace):
    loader = tuned(RecipeJpegs(load_items(args.items), args.size), args)
    return lambda: loader


if __name__ == "__main__":
    serve("hand-tuned DataLoader, ImageNet recipe", pack, open_loader)
