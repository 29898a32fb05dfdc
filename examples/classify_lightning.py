"""Image classification in PyTorch Lightning on a packed dataset: DDP-ready, exact validation.

    python examples/classify_lightning.py                     # tiny generated shapes, on the CPU
    python examples/classify_lightning.py --data packed/ --size 224 --epochs 90 \\
        --devices 8 --strategy ddp                            # your own, on a GPU node

``FeedpipeDataModule`` makes each rank's loaders for the trainer's world: the training loader
shuffles, crops and flips in its worker processes; the validation loader uses
``Sampler(uneven="mask")``, so every rank gets the same number of full batches and the padding
rows say ``valid=False``: summed over the ranks, the validation counts each sample exactly once
(a DistributedSampler pads by repeating samples, and counts some twice). At the end the script
prints the validation count and accuracy, then the last epoch's data-wait share (the share of
training time spent waiting for the next batch).

Your own data: ``feedpipe convert imgs/ --to lmdb -o packed/ --val-fraction 0.1`` (an ImageFolder
tree; it writes packed/train and packed/val), then ``--data packed/``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import lightning
import torch

import feedpipe
from feedpipe.integrations.lightning import FeedpipeCallback, FeedpipeDataModule


class Classifier(lightning.LightningModule):
    """A few conv layers: enough for the generated shapes, a stand-in for your model."""

    def __init__(self, classes: int, lr: float = 0.01) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, classes))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(self.net(batch["image"]), batch["label"])
        self.log("train_loss", loss, batch_size=len(batch["label"]))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        ok = batch["valid"]  # False on the padding rows of the last step
        preds = self.net(batch["image"]).argmax(1)
        n = len(ok)
        self.log("val_correct", (preds[ok] == batch["label"][ok]).sum().float(),
                 reduce_fx="sum", sync_dist=True, batch_size=n)
        self.log("val_samples", ok.sum().float(), reduce_fx="sum", sync_dist=True, batch_size=n)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def prepare(args: argparse.Namespace) -> Path:
    """The packed dataset (a folder with train/ and val/): ``--data``, or tiny generated shapes
    converted with ``feedpipe.convert`` (only in the launching process: DDP's other ranks, which
    Lightning starts by running this script again, find it made)."""
    if args.data:
        return Path(args.data)
    packed = args.work / "packed"
    if os.environ.get("LOCAL_RANK") is not None:  # a DDP rank started by Lightning: made already
        return packed
    if packed.exists():
        print(f"using {packed}, made by an earlier run (remove it to generate anew)")
    else:
        import tiny_data

        src = tiny_data.shapes(args.work / "shapes", n=args.samples)
        feedpipe.convert(src, packed, to="lmdb", val_fraction=0.25, seed=0)
    return packed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="a packed dataset folder holding train/ and val/")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "feedpipe-examples"
                   / "classify", help="where the generated data goes (without --data)")
    p.add_argument("--samples", type=int, default=192, help="generated images (without --data)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=48, help="training resolution (square)")
    p.add_argument("--workers", default="auto", help="loader processes per rank, or auto")
    p.add_argument("--devices", default="auto", help="Lightning's devices (e.g. 8)")
    p.add_argument("--strategy", default="auto", help="Lightning's strategy (e.g. ddp)")
    args = p.parse_args()
    data = prepare(args)
    workers = args.workers if args.workers == "auto" else int(args.workers)
    # the validation loader: Sampler(uneven="mask"), no shuffle, centre crop (the module's
    # evaluation defaults); the training options below go to the training loader
    dm = FeedpipeDataModule(train=data / "train", val=data / "val", batch_size=args.batch_size,
                            size=args.size, flip=True,
                            crop=feedpipe.RandomResizedCrop(scale=(0.5, 1.0)),
                            num_workers=workers)
    classes = feedpipe.open_dataset(data / "train").classes
    trainer = lightning.Trainer(max_epochs=args.epochs, devices=args.devices,
                                strategy=args.strategy, default_root_dir=args.work,
                                enable_progress_bar=False, enable_model_summary=False,
                                logger=False, enable_checkpointing=False)
    trainer.fit(Classifier(len(classes)), datamodule=dm)
    if trainer.is_global_zero:
        seen = int(trainer.callback_metrics["val_samples"])
        correct = int(trainer.callback_metrics["val_correct"])
        print(f"validation: {seen} samples, each counted once over {trainer.world_size} "
              f"rank(s); accuracy {correct / seen:.1%} ({', '.join(classes)})")
        meter = next(c for c in trainer.callbacks if isinstance(c, FeedpipeCallback)).meter
        print(meter.summary())  # the last epoch's; the logger gets feedpipe/data_wait_share


if __name__ == "__main__":
    main()
