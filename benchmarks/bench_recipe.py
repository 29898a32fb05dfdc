"""The standard ImageNet training recipe at 224², side by side in one run.

Random-resized-crop, flip, ColorJitter(0.4, 0.4, 0.4), normalize, RandomErasing(0.25), on the
same ~500×375 files (and LMDB packing) as ``bench_kernel.py``, 2 workers, batch 64, float32 out:

- ``feedpipe built-in``: crop and flip, then ``batch_transforms=[ColorJitter(0.4, 0.4, 0.4),
  RandomErasing(0.25, value=IMAGENET_MEAN)]`` and the normalization on each batch, all in the
  workers (on a CUDA device the batch operations run there instead);
- ``feedpipe transform=``: the same colour jitter and erasing as a user's per-sample function in
  the workers (``peers/tv_recipe.user_augment``: torchvision v2's formulas on the uint8 view);
- ``hand-tuned DataLoader``: the loose JPEG files, PIL decode, the torchvision-style recipe
  (``peers/tv_recipe.Recipe``: no torchvision here, its v2 functionals written out), 2
  persistent workers on one torch thread each, prefetch 4;
- the bare kernel (decode + random-resized crop + resize, bench_kernel's) in 1 and 2 processes;
- ``feedpipe crop+flip`` (uint8, bench_kernel's configuration plus flip) and ``feedpipe
  crop+flip+normalize`` (float32, no augmentation): what the augmentations add is measured
  against them;
- ``user function alone``: ``user_augment`` on 224² uint8 images on one thread, in-process (its
  own time), and ``feedpipe transform=no-op`` (a function that does nothing): the hook's cost is
  the workers' CPU per image of transform= minus crop+flip+normalize, against the function's
  own; and no-op's minus crop+flip+normalize, the hook alone.

Interleaved rounds (benchmarks/harness.py), CPU ms per image of all processes beside images/s:
ratios are medians of the rounds' own ratios.

    python benchmarks/bench_recipe.py [--images 1024] [--rounds 5] [--data bench-data]
                                      [--json benchmarks/results/recipe.json]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import psutil
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "peers")]
from bench_kernel import (  # noqa: E402
    BATCH,
    SIZE,
    WORKERS,
    _init,
    _pool_kernel,
    group,
    kernel,
    packed,
    paired,
    plan,
)
from harness import Items, drain, machine, one_thread, save  # noqa: E402
from tv_recipe import Recipe, no_op, user_augment  # noqa: E402

import feedpipe  # noqa: E402
from feedpipe.loader.augment import ColorJitter, RandomErasing  # noqa: E402
from feedpipe.loader.config import IMAGENET_MEAN  # noqa: E402

CROP = "random_resized_crop"


class LooseJpegs(Dataset):
    """The hand-tuned DataLoader's dataset: one PIL decode and the recipe per sample."""

    def __init__(self, files: list[Path], size: int) -> None:
        self.files, self.recipe = files, Recipe(size)
        classes = sorted({f.parent.name for f in files})  # ImageFolder's labels
        self.labels = [classes.index(f.parent.name) for f in files]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[i]) as im:
            return self.recipe(im), self.labels[i]


def loaders(lmdb: Path) -> dict[str, object]:
    """The feedpipe configurations, each on the same files and workers."""
    common = dict(size=SIZE, crop=CROP, flip=True, device="cpu", num_workers=WORKERS, seed=0)
    return {
        "feedpipe crop+flip (uint8)": feedpipe.make_loader(
            lmdb, BATCH, output=feedpipe.Output(dtype="uint8"), **common),
        "feedpipe crop+flip+normalize": feedpipe.make_loader(lmdb, BATCH, **common),
        "feedpipe built-in": feedpipe.make_loader(
            lmdb, BATCH, batch_transforms=[ColorJitter(0.4, 0.4, 0.4),
                                           RandomErasing(0.25, value=IMAGENET_MEAN)], **common),
        "feedpipe transform=": feedpipe.make_loader(lmdb, BATCH, transform=user_augment,
                                                    **common),
        "feedpipe transform=no-op": feedpipe.make_loader(lmdb, BATCH, transform=no_op, **common),
    }


def user_alone(images: torch.Tensor) -> int:
    """The user function on each 224² image, in-process on one thread (its own time)."""
    rng = np.random.default_rng(0)
    for img in images:
        user_augment({"image": img}, rng)
    return len(images)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=1024, help="~500x375 photos (bench_kernel's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/recipe.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # the bare kernel's setting; the main process's share of 2 cores
    m = machine()
    print(f"machine: {m['cpu']}, {m['usable_cores']} usable cores, torch {m['torch']}; "
          f"{SIZE}² out, batch {BATCH}, {WORKERS} workers", flush=True)
    paths = packed(args.data, "500x375", args.images)
    files = sorted(paths["photos"].rglob("*.jpg"))
    blobs = [p.read_bytes() for p in files]
    boxes = plan(blobs, CROP)
    images = torch.randint(0, 256, (BATCH, 3, SIZE, SIZE), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    images = images.contiguous(memory_format=torch.channels_last)  # the loader's sample layout
    dl = DataLoader(LooseJpegs(files, SIZE), batch_size=BATCH, shuffle=True,
                    num_workers=WORKERS, persistent_workers=True, prefetch_factor=4,
                    worker_init_fn=one_thread)
    with mp.get_context("spawn").Pool(WORKERS, initializer=_init,
                                      initargs=(blobs, boxes)) as pool:
        runs: dict[str, Callable[[], Items]] = {
            "kernel 1p": lambda: kernel(blobs, boxes, True),
            f"kernel {WORKERS}p": lambda: sum(pool.starmap(_pool_kernel,
                                                           [(True, p) for p in range(WORKERS)])),
            "user function alone, 1 thread": lambda: user_alone(images.clone(
                memory_format=torch.channels_last)),
            "hand-tuned DataLoader": lambda: drain(dl),
        }
        lds = loaders(paths["lmdb"])
        runs.update({name: (lambda ld=ld: drain(ld)) for name, ld in lds.items()})
        res = group(f"ImageNet recipe, 500x375 photos, {args.images} images", runs, args.rounds)
    rat = ratios(res)
    print("\n| configuration | images/s | CPU ms/img (all processes) | main CPU ms/img |\n"
          "|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['rate']:,.0f} | {r['cpu_ms_per_image']:.3f} | "
              f"{r['main_cpu_ms_per_image']:.3f} |")
    print()
    for k, v in rat.items():
        print(f"{k}: {v:.3f}")
    print(f"load average during the run (1/5/15 min): {psutil.getloadavg()}")
    save(args.json, [], {"results": res, "ratios": rat, "args": {
        k: str(v) for k, v in vars(args).items()}, "size": SIZE, "batch": BATCH})
    print(f"wrote {args.json}")


def ratios(res: dict[str, dict]) -> dict[str, float]:
    """The issue's goals, each the median of the rounds' own ratios (bench_kernel's paired)."""
    rate, cpu = "rate", "cpu_ms_per_image"
    dl, k2 = res["hand-tuned DataLoader"], res[f"kernel {WORKERS}p"]
    built, user = res["feedpipe built-in"], res["feedpipe transform="]
    plain, norm = res["feedpipe crop+flip (uint8)"], res["feedpipe crop+flip+normalize"]
    fn = res["user function alone, 1 thread"][cpu]

    def workers(r: dict) -> float:  # the hook runs in the workers: main-process noise left out
        return r[cpu] - r["main_cpu_ms_per_image"]
    return {
        "built-in ÷ hand-tuned DataLoader, images/s (goal >= 2)": paired(built, dl, rate),
        "built-in ÷ hand-tuned DataLoader, by CPU per image": paired(built, dl, cpu, invert=True),
        "built-in ÷ transform=, images/s": paired(built, user, rate),
        "transform= added worker CPU ms/img ÷ the function's own (goal <= 1.05)":
            (workers(user) - workers(norm)) / fn,
        "transform=no-op added worker CPU ms/img ÷ the function's own":
            (workers(res["feedpipe transform=no-op"]) - workers(norm)) / fn,
        "crop+flip (uint8): wall share of 2p kernel ceiling": paired(plain, k2, rate),
        "crop+flip (uint8): CPU share of 2p kernel ceiling": paired(plain, k2, cpu, invert=True),
        "built-in: wall share of 2p kernel ceiling": paired(built, k2, rate),
    }


if __name__ == "__main__":
    main()
