"""Contender: WebDataset 1.0 (tar shards of the original JPEG bytes), read as its docs recommend.

Docs followed: https://webdataset.github.io/webdataset/sharding/ ("Sharding, Parallel I/O, and
DataLoader") and the project README (https://github.com/webdataset/webdataset):
``wds.WebDataset(urls, shardshuffle=...).shuffle(n).decode("pil").to_tuple("jpg", "cls")
.map_tuple(preproc, identity)``, batching done in the dataset with ``.batched(batch_size)`` and a
``WebLoader(dataset, batch_size=None, num_workers=...)``. Shards are written with
``wds.ShardWriter`` (the docs' writer) holding the source files' bytes unchanged.
``preproc`` is torchvision's ``Resize(224)`` + ``CenterCrop(224)`` + ``PILToTensor`` written out
(common.pil_resize_center_crop); workers are persistent across epochs like the hand-tuned
DataLoader's.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import torch
import webdataset as wds

from common import pil_resize_center_crop, serve

SHARDS = 8  # several shards per worker, so split_by_worker balances the 2 workers


def pack(items: list[tuple[str, int]], work: Path, args: argparse.Namespace) -> None:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    order = np.random.default_rng(0).permutation(len(items))  # shards hold a shuffled order
    per = -(-len(items) // SHARDS)
    with wds.ShardWriter(str(work / "shard-%06d.tar"), maxcount=per, verbose=0) as sink:
        for i in order:
            path, label = items[i]
            sink.write({"__key__": f"{i:08d}", "jpg": Path(path).read_bytes(), "cls": label})


def open_loader(work: Path, args: argparse.Namespace):
    size = args.size
    urls = sorted(str(p) for p in work.glob("shard-*.tar"))

    def preproc(im):
        return torch.from_numpy(pil_resize_center_crop(im, size)).permute(2, 0, 1)  # RGB already

    dataset = (wds.WebDataset(urls, shardshuffle=len(urls))
               .shuffle(1000)
               .decode("pil")
               .to_tuple("jpg", "cls")
               .map_tuple(preproc, lambda y: y)
               .batched(args.batch))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=args.workers,
                           persistent_workers=True)

    def epoch():
        for images, labels in loader:
            yield images, torch.as_tensor(labels)
    return epoch


if __name__ == "__main__":
    serve("WebDataset", pack, open_loader)
