"""What every contender shares: the task, the torchvision-equivalent crops, and the serve loop.

A contender is a script that packs the source photos into its own format, then answers commands
from ``run.py`` on stdin, one JSON line each on stdout:

    (start)          -> {"pack_s": ...}               after packing into --work
    epoch [validate] -> {"n": ..., "seconds": ..., "first_batch_s": ..., "waits": [...],
                         "steps": [...], "rows": [...], "labels": {...}, ...}
    quit             -> exits

The harness measures CPU time and PSS of the contender's process tree from outside; the contender
itself reports only what it saw: sample count, per-batch timings (``feedpipe.tools.monitor``'s
StallMeter, which ``run.py`` rates with the one samples/s definition, ``feedpipe.tools.throughput``),
per-label counts, batch shapes and dtypes, and (on a validating epoch) the mean pixel per label and
channel, which ``run.py`` compares with a reference decode of the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from feedpipe.tools.monitor import LoaderInfo, StallMeter

Batch = tuple[torch.Tensor, torch.Tensor]  # images N×3×H×W uint8, labels N int64


def load_items(path: Path) -> list[tuple[str, int]]:
    """The source photos as (absolute path, label), written by run.py from ``converters.scan``."""
    return [(p, int(y)) for p, y in json.loads(Path(path).read_text())]


def pil_resize_center_crop(im: Image.Image, size: int) -> np.ndarray:
    """torchvision ``Resize(size)`` + ``CenterCrop(size)`` on a PIL image, written out.

    Resize: shorter side to ``size`` (longer side truncated as torchvision does), PIL BILINEAR,
    which is what torchvision calls for PIL input (PIL's resize is antialiased). CenterCrop: the
    rounded centre box.
    """
    w, h = im.size
    if w <= h:
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    im = im.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return np.array(im.crop((left, top, left + size, top + size)))  # PILToTensor copies too


def tensor_resize_center_crop(chw: torch.Tensor, size: int) -> torch.Tensor:
    """torchvision.transforms.v2 ``Resize(size, antialias=True)`` + ``CenterCrop(size)`` on a uint8
    C×H×W tensor: v2's resize calls ``F.interpolate(..., mode="bilinear", antialias=True)``."""
    h, w = chw.shape[-2:]
    nh, nw = (int(size * h / w), size) if w <= h else (size, int(size * w / h))
    y = F.interpolate(chw.unsqueeze(0), size=(nh, nw), mode="bilinear", antialias=True,
                      align_corners=False)[0]
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return y[:, top: top + size, left: left + size]


def one_thread(_: int = 0) -> None:
    """``worker_init_fn``: one torch thread per DataLoader worker (the hand-tuned setting)."""
    torch.set_num_threads(1)


class Stats:
    """Per-epoch checks: count, labels, shapes, dtypes, and per-label channel means if asked."""

    def __init__(self, classes: int, validate: bool) -> None:
        self.n = 0
        self.labels = torch.zeros(classes, dtype=torch.int64)
        self.shapes: set[str] = set()
        self.dtypes: set[str] = set()
        self.validate = validate
        self.sums = torch.zeros(classes, 3, dtype=torch.float64)

    def add(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        labels = labels.reshape(-1).long()
        self.n += int(labels.numel())
        self.labels += torch.bincount(labels, minlength=len(self.labels))[: len(self.labels)]
        self.shapes.add(str(tuple(images.shape[1:])))
        self.dtypes.add(str(images.dtype).replace("torch.", ""))
        if images.shape[0] != labels.numel():
            self.shapes.add(f"batch {images.shape[0]} images vs {labels.numel()} labels")
        if self.validate:
            means = images.float().mean(dim=(2, 3)).double()  # N×3
            self.sums.index_add_(0, labels, means)

    def report(self) -> dict:
        out = {"n": self.n, "labels": self.labels.tolist(), "shapes": sorted(self.shapes),
               "dtypes": sorted(self.dtypes)}
        if self.validate:
            counts = self.labels.clamp(min=1).double().unsqueeze(1)
            out["class_means"] = (self.sums / counts).tolist()
        return out


def serve(name: str, pack: Callable[[list[tuple[str, int]], Path, argparse.Namespace], None],
          open_loader: Callable[[Path, argparse.Namespace], Callable[[], Iterable[Batch]]]) -> None:
    """Parse the common arguments, pack, then run epochs on command (see the module docstring).

    ``open_loader(work, args)`` builds the contender's loader and returns a function that iterates
    one epoch as (images, labels) pairs; it is called at the first epoch, so its cost counts in that
    epoch's time to first batch (``startup_s``).
    """
    ap = argparse.ArgumentParser(description=f"peers benchmark contender: {name}")
    ap.add_argument("--items", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--classes", type=int, required=True)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    args, _ = ap.parse_known_args()
    global _OUT
    _OUT = os.fdopen(os.dup(1), "w")  # replies go here; libraries' prints go to the log (stderr)
    os.dup2(2, 1)
    torch.set_num_threads(1)  # the same main-process setting for every contender
    items = load_items(args.items)
    t = time.perf_counter()
    pack(items, args.work, args)
    _reply({"pack_s": time.perf_counter() - t})
    epoch_fn: Callable[[], Iterable[Batch]] | None = None
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        t0 = time.perf_counter()
        startup = epoch_fn is None
        if epoch_fn is None:
            epoch_fn = open_loader(args.work, args)
        stats = Stats(args.classes, "validate" in cmd)
        first = None
        meter = StallMeter(cuda_sync=False, loader_info=LoaderInfo())
        batches: Iterator[Batch] = meter.wrap(epoch_fn())
        for images, labels in batches:
            if first is None:
                first = time.perf_counter() - t0
            stats.add(images, labels)
        _reply({"seconds": time.perf_counter() - t0, "first_batch_s": first, "startup": startup,
                "waits": meter.waits, "steps": meter.steps, "rows": meter.rows,
                **stats.report()})


_OUT = sys.stdout


def _reply(obj: dict) -> None:
    _OUT.write(json.dumps(obj) + "\n")
    _OUT.flush()
