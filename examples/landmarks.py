"""Facial landmarks (98 points, WFLW-style) with your own augmentation next to feedpipe's geometry.

    python examples/landmarks.py                          # tiny generated faces, on the CPU
    python examples/landmarks.py --data faces.lmdb --size 256 --epochs 60

The landmarks are a keypoints field: feedpipe's crop, flip and ``RandomAffine`` move them with
the image (a flip also swaps left and right points through the flip indices stored at
conversion), and points pushed out of the crop come back with ``landmarks_visible=False``. Your
own per-sample function, ``transform=fn(sample, rng)``, runs in the loader's workers after the
crop, here a photometric one (brightness, contrast, noise): it draws every random number from
``rng``, which feedpipe seeds from (seed, epoch, sample), so the batches are the same for any
number of workers and after a resume. The loss is the mean point error over visible points, in
pixels of the output. At the end: the validation error and the data-wait share.

Your own data: a CSV/JSONL manifest with a ``path`` column and a ``landmarks`` column of
``[[x, y], ...]`` (98 points, pixels of the image), converted with
``feedpipe convert faces.csv --to lmdb -o faces.lmdb --keypoints-column landmarks
--flip-indices 1,0,3,2,... --val-fraction 0.1`` (the flip indices: your layout's mirror of
each point), then ``--data faces.lmdb``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

import feedpipe
from converters import LabelColumns
from feedpipe.loader.transforms import RandomAffine


def augment(sample: dict[str, torch.Tensor], rng: np.random.Generator) -> None:
    """Your own augmentation: brightness, contrast and sensor noise, drawn from ``rng`` (never
    from ``random`` or torch's global generator, which differ per worker), written in place into
    the sample's row of the batch (``image``: C×H×W uint8)."""
    img = sample["image"]
    x = img.float()
    x = (x - x.mean()) * rng.uniform(0.7, 1.3) + x.mean() * rng.uniform(0.7, 1.3)
    x += torch.from_numpy(rng.normal(0, 4, x.shape).astype(np.float32))
    img.copy_(x.clamp(0, 255).to(torch.uint8))


class LandmarkNet(torch.nn.Module):
    """A few conv layers regressing the points as fractions of the image (0..1)."""

    def __init__(self, points: int) -> None:
        super().__init__()
        self.points = points
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 24, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(24, 48, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(48, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(),
            torch.nn.Linear(64 * 16, points * 2), torch.nn.Sigmoid())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.net(image).view(-1, self.points, 2)


def point_error(pred: torch.Tensor, batch: dict[str, torch.Tensor], size: int) -> torch.Tensor:
    """Mean distance in output pixels between predicted and true visible points."""
    visible = batch["landmarks_visible"]
    dist = (pred * size - batch["landmarks"]).norm(dim=-1)
    return dist[visible].mean()


def prepare(args: argparse.Namespace) -> Path:
    """The packed dataset (train/ and val/): ``--data``, or generated faces converted with
    ``feedpipe.convert``, their landmarks column declared as keypoints with flip indices."""
    if args.data:
        return Path(args.data)
    packed = args.work / "faces.lmdb"
    if packed.exists():
        print(f"using {packed}, made by an earlier run (remove it to generate anew)")
    else:
        import tiny_data

        manifest = tiny_data.faces(args.work / "faces", n=args.samples)
        feedpipe.convert(manifest, packed, to="lmdb", val_fraction=0.2, seed=0,
                         columns=LabelColumns(keypoints="landmarks",
                                              flip_indices=tuple(tiny_data.FACE_FLIP)))
    return packed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="a packed dataset folder (train/, val/) with a 98-point "
                   "'landmarks' keypoints field")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "feedpipe-examples"
                   / "landmarks", help="where the generated data goes (without --data)")
    p.add_argument("--samples", type=int, default=160, help="generated faces (without --data)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--size", type=int, default=64, help="training resolution (square)")
    p.add_argument("--workers", default="auto", help="loader processes, or auto")
    args = p.parse_args()
    data = prepare(args)
    workers = args.workers if args.workers == "auto" else int(args.workers)
    fields = ["image", "landmarks"]
    train = feedpipe.make_loader(
        data / "train", args.batch_size, size=args.size, fields=fields, num_workers=workers,
        crop=feedpipe.RandomResizedCrop(scale=(0.7, 1.0), ratio=(0.9, 1.1)), flip=True,
        affine=RandomAffine(degrees=15, scale=(0.9, 1.1)), transform=augment)
    val = feedpipe.make_loader(data / "val", args.batch_size, size=args.size, fields=fields,
                               num_workers=workers, shuffle=False, crop="resize")
    model = LandmarkNet(points=98)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    meter = feedpipe.StallMeter()
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        model.train()
        for batch in meter.wrap(train):
            loss = point_error(model(batch["image"]), batch, args.size)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            errors = [point_error(model(b["image"]), b, args.size).item() for b in val]
        print(f"epoch {epoch}: train {loss.item():.2f} px, validation {np.mean(errors):.2f} px "
              f"mean point error at {args.size}x{args.size}")
    print(meter.summary())


if __name__ == "__main__":
    main()
