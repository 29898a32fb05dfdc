"""Batch operations on the device: each built-in operation's cost per batch.

A batch of random images (64×3×224×224 by default), uint8 and float32 in [0, 1], already on the
device; each operation called with a generator seeded per batch, as the loader does. On the CPU
it runs on ``--threads`` threads (1: the main process's share when the workers own the cores);
with CUDA, on the GPU too (synchronized per batch, so the time is the kernels', not the launch's).

    python benchmarks/bench_augment.py [--batches 20] [--batch 64] [--size 224] [--threads 1]
                                       [--devices cpu,cuda] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Result, measure, save  # noqa: E402

from feedpipe.loader.augment import (  # noqa: E402
    BatchOps,
    ColorJitter,
    CutMix,
    MixUp,
    RandomErasing,
    RandomGrayscale,
)

CLASSES = 1000


def operations() -> dict[str, Callable]:
    """The built-ins at typical settings and the ImageNet recipe's device part."""
    return {
        "ColorJitter(0.4, 0.4, 0.4)": ColorJitter(0.4, 0.4, 0.4),
        "ColorJitter(0.4, 0.4, 0.4, 0.1)": ColorJitter(0.4, 0.4, 0.4, 0.1),
        "RandomGrayscale(0.2)": RandomGrayscale(0.2),
        "RandomErasing(0.25)": RandomErasing(0.25),
        "MixUp(0.2)": MixUp(0.2, CLASSES),
        "CutMix(1.0)": CutMix(1.0, CLASSES),
        "recipe: ColorJitter(0.4, 0.4, 0.4) + RandomErasing(0.25)":
            BatchOps([ColorJitter(0.4, 0.4, 0.4), RandomErasing(0.25)]),
    }


def make_batch(n: int, size: int, dtype: torch.dtype, device: torch.device) -> dict:
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    if dtype != torch.uint8:
        image = image.to(dtype) / 255
    image = image.contiguous(memory_format=torch.channels_last)  # the loader's default layout
    label = torch.randint(0, CLASSES, (n,), generator=g)
    return {"image": image.to(device), "label": label.to(device)}


def bench(device: torch.device, args: argparse.Namespace) -> list[Result]:
    results = []
    for dtype in (torch.uint8, torch.float32):
        batch = make_batch(args.batch, args.size, dtype, device)
        print(f"{device.type}, {str(dtype).removeprefix('torch.')} input:", flush=True)
        for name, op in operations().items():
            seeds = itertools.count()

            def run(op: Callable = op, batch: dict = batch, seeds: Iterator = seeds) -> int:
                op(batch, torch.Generator().manual_seed(next(seeds)))  # seeded per batch
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                return args.batch

            r = measure(f"{name} [{device.type}, {str(dtype).removeprefix('torch.')}]", run,
                        repeats=args.batches, warmup=1)
            print(f"  {'':<44} {1e3 * args.batch / r.rate:>10.2f} ms/batch", flush=True)
            results.append(r)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=20, help="timed batches per operation")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the CPU runs")
    ap.add_argument("--devices", default="cpu,cuda",
                    help="comma-separated; cuda is skipped when unavailable")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/augment.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results, ran = [], []
    for name in args.devices.split(","):
        if name == "cuda" and not torch.cuda.is_available():
            print("cuda: skipped (no CUDA device)")
            continue
        ran.append(torch.cuda.get_device_name() if name == "cuda" else f"cpu ({args.threads} "
                   f"thread{'s' if args.threads > 1 else ''})")
        results += bench(torch.device(name), args)
    save(args.json, results, {"devices": ran, "batch": args.batch, "size": args.size,
                              "ms_per_batch": {r.name: 1e3 * args.batch / r.rate
                                               for r in results}})


if __name__ == "__main__":
    main()
