"""Segmentation with a boundary-aware loss from distance maps precomputed at conversion.

    python examples/segmentation.py                       # tiny generated blobs, on the CPU
    python examples/segmentation.py --data seg.lmdb --size 256 --epochs 50

A distance transform per mask costs milliseconds of CPU per image, every epoch, when computed in
the training loop; here it is computed once, in the conversion's worker processes, and stored
beside each mask (``targets=[make_distance_map(signed=True, truncate=8)]``). The loader's crop,
resize and flip cut the image, the mask (nearest) and the distance map (bilinear, its values
rescaled by the crop's scale) with one plan. The loss adds to the cross-entropy a boundary term
(Kervadec et al.'s boundary loss): the predicted foreground probability times the signed distance
to the object's edge, which pushes predictions towards the true boundary. At the end: the
validation IoU and the data-wait share.

Your own data: images and index-PNG masks (0 background, 1..K-1 classes) matched by file name,
converted with ``feedpipe convert images/ --masks masks/ --targets distance_map
--distance-signed --distance-truncate 8 --to lmdb -o seg.lmdb --val-fraction 0.1``, then
``--data seg.lmdb``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import feedpipe
from converters import make_distance_map


class TinyUNet(torch.nn.Module):
    """Down twice, up twice, one skip: per-pixel logits for background and object."""

    def __init__(self, classes: int = 2) -> None:
        super().__init__()

        def block(i: int, o: int) -> torch.nn.Module:
            return torch.nn.Sequential(torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.ReLU())

        self.down1, self.down2 = block(3, 16), block(16, 32)
        self.mid = block(32, 32)
        self.up2, self.up1 = block(64, 16), block(32, 16)
        self.head = torch.nn.Conv2d(16, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool, up = torch.nn.functional.max_pool2d, torch.nn.functional.interpolate
        d1 = self.down1(x)
        d2 = self.down2(pool(d1, 2))
        m = self.mid(pool(d2, 2))
        u2 = self.up2(torch.cat([up(m, scale_factor=2), d2], 1))
        u1 = self.up1(torch.cat([up(u2, scale_factor=2), d1], 1))
        return self.head(u1)


def loss_fn(logits: torch.Tensor, batch: dict[str, torch.Tensor], boundary: float
            ) -> torch.Tensor:
    """Cross-entropy plus the boundary term: mean of p(object) × signed distance (negative
    inside the object, positive outside), normalized by the truncation."""
    mask = batch["mask"].long()
    ce = torch.nn.functional.cross_entropy(logits, mask)
    p_object = logits.softmax(1)[:, 1]
    return ce + boundary * (p_object * batch["distance_map"] / 8).mean()


def iou(logits: torch.Tensor, mask: torch.Tensor) -> tuple[int, int]:
    """(intersection, union) of predicted and true object pixels."""
    pred, true = logits.argmax(1) == 1, mask == 1
    return int((pred & true).sum()), int((pred | true).sum())


def prepare(args: argparse.Namespace) -> Path:
    """The packed dataset (train/ and val/): ``--data``, or generated images and masks
    converted with the distance maps computed in the conversion's workers."""
    if args.data:
        return Path(args.data)
    packed = args.work / "seg.lmdb"
    if packed.exists():
        print(f"using {packed}, made by an earlier run (remove it to generate anew)")
    else:
        import tiny_data

        images, masks = tiny_data.blobs(args.work / "blobs", n=args.samples)
        feedpipe.convert(images, packed, to="lmdb", masks=masks, val_fraction=0.25, seed=0,
                         targets=[make_distance_map(signed=True, truncate=8)])
    return packed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="a packed dataset folder (train/, val/) with a mask and a "
                   "signed distance_map truncated at 8")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "feedpipe-examples"
                   / "segmentation", help="where the generated data goes (without --data)")
    p.add_argument("--samples", type=int, default=96, help="generated images (without --data)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--size", type=int, default=48, help="training resolution (square)")
    p.add_argument("--boundary", type=float, default=0.5, help="the boundary term's weight")
    p.add_argument("--workers", default="auto", help="loader processes, or auto")
    args = p.parse_args()
    data = prepare(args)
    workers = args.workers if args.workers == "auto" else int(args.workers)
    fields = ["image", "mask", "distance_map"]
    train = feedpipe.make_loader(data / "train", args.batch_size, size=args.size, fields=fields,
                                 crop=feedpipe.RandomResizedCrop(scale=(0.5, 1.0)), flip=True,
                                 num_workers=workers)
    val = feedpipe.make_loader(data / "val", args.batch_size, size=args.size, fields=fields,
                               crop="resize", shuffle=False, num_workers=workers)
    model = TinyUNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    meter = feedpipe.StallMeter()
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        for batch in meter.wrap(train):
            loss = loss_fn(model(batch["image"]), batch, args.boundary)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        inter = union = 0
        with torch.no_grad():
            for batch in val:
                i, u = iou(model(batch["image"]), batch["mask"])
                inter, union = inter + i, union + u
        print(f"epoch {epoch}: loss {loss.item():.3f}, validation IoU {inter / max(union, 1):.2f}")
    print(meter.summary())


if __name__ == "__main__":
    main()
