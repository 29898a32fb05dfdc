"""Loader throughput, side by side in one run.

naive ImageFolder DataLoader (num_workers=0) and a hand-tuned DataLoader on the loose JPEGs versus
``make_loader`` on the same images packed as LMDB, HDF5, WebDataset (original JPEG bytes) and raw
LMDB; plus the decode ceiling (best single-core decode+resize rate × usable cores, the issue's
definition) and the parallel decode ceiling (the same kernel run in one process per core at once,
which is what the cores really deliver together). Output is 224×224 uint8 (center crop), batch 64,
one epoch per run, median of 3 after a warm-up.

    python benchmarks/bench_loader.py [--images 3000] [--data bench-data] [--json FILE]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from feedpipe import Output

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Result, drain, measure, one_thread, save  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert, scan  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe.loader.config import usable_cores  # noqa: E402
from feedpipe.loader.transforms import ImageOp  # noqa: E402

SIZE, BATCH = 224, 64


def pil_center_crop(path: str) -> np.ndarray:
    """What a typical ImageFolder pipeline does: PIL open, convert, resize shorter side, crop."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        s = SIZE / min(w, h)
        im = im.resize((max(SIZE, round(w * s)), max(SIZE, round(h * s))), Image.BILINEAR)
        w, h = im.size
        left, top = (w - SIZE) // 2, (h - SIZE) // 2
        return np.asarray(im.crop((left, top, left + SIZE, top + SIZE)))


class ImageFolderDataset(Dataset):
    """The baseline: one PIL decode per __getitem__, default collate."""

    def __init__(self, root: Path) -> None:
        src = scan(root)
        self.items = [(str(i.path), i.label) for i in src.items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        return torch.from_numpy(pil_center_crop(path)).permute(2, 0, 1), label


def single_core_rate(blobs: list[bytes], fn: object) -> Result:
    return measure("  " + fn.__name__, lambda: sum(1 for b in blobs if fn(b) is not None),
                   repeats=3)


def _parallel_kernel(args: tuple[list[bytes], int, object]) -> float:
    """One core's share of the parallel ceiling: decode+resize every blob ``repeats`` times."""
    blobs, repeats, barrier = args
    torch.set_num_threads(1)
    op = ImageOp((SIZE, SIZE), "center_crop")
    slot = np.empty((SIZE, SIZE, 3), np.uint8)
    for b in blobs[:50]:  # warm-up
        op.apply(b, "jpeg", slot, None, "bench")
    barrier.wait()  # type: ignore[attr-defined]
    t = time.perf_counter()
    for _ in range(repeats):
        for b in blobs:
            op.apply(b, "jpeg", slot, None, "bench")
    return repeats * len(blobs) / (time.perf_counter() - t)


def parallel_ceiling(blobs: list[bytes], cores: int, repeats: int = 3) -> float:
    """Sum of the per-process decode+resize rates with ``cores`` processes running at once."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(cores)
        with ctx.Pool(cores) as pool:
            return sum(pool.map(_parallel_kernel, [(blobs, repeats, barrier)] * cores))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/loader.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # the same main-process setting for every configuration
    cores = usable_cores()
    photos = args.data / f"photos-{args.images}"
    if not photos.exists():
        print(f"generating {args.images} photos (~500x375) in {photos}")
        make_photos(photos, args.images, size=(500, 375), classes=7, seed=1)
    packed = {}
    for fmt, store in (("lmdb", "passthrough"), ("hdf5", "passthrough"), ("wds", "passthrough"),
                       ("lmdb", "raw")):
        out = args.data / f"{fmt}-{store}-{args.images}"
        if not out.exists():
            convert(photos, out, to=fmt, store=store, resize=SIZE if store == "raw" else None,
                    writer_options={"shard_size": 32 << 20} if fmt == "wds" else None)
        packed[f"{fmt}-{store}"] = out

    print(f"\nmachine: {cores} usable cores; output {SIZE}x{SIZE} uint8, batch {BATCH}")
    results: list[Result] = []

    print("decode + resize, one core (images/s):")
    blobs = [p.read_bytes() for p in sorted(photos.rglob("*.jpg"))[:500]]
    op = ImageOp((SIZE, SIZE), "center_crop")
    slot = np.empty((SIZE, SIZE, 3), np.uint8)

    def feedpipe_decode(b: bytes) -> np.ndarray:
        op.apply(b, "jpeg", slot, None, "bench")
        return slot

    def pil_decode(b: bytes) -> np.ndarray:
        import io
        return pil_center_crop(io.BytesIO(b))  # type: ignore[arg-type]

    per_core = [single_core_rate(blobs, feedpipe_decode), single_core_rate(blobs, pil_decode)]
    best = max(per_core, key=lambda r: r.rate)
    ceiling = best.rate * cores
    print(f"  decode ceiling = {best.rate:,.0f} x {cores} cores = {ceiling:,.0f} images/s")
    par = parallel_ceiling(blobs, cores)
    print(f"  parallel decode ceiling ({cores} processes at once) = {par:,.0f} images/s "
          f"({100 * par / ceiling:.0f}% of single-core x cores)")
    results += per_core

    print("loaders, one epoch per run (images/s):")
    folder = ImageFolderDataset(photos)
    naive = DataLoader(folder, batch_size=BATCH, shuffle=True)
    results.append(measure("naive DataLoader (workers=0), loose JPEG",
                           lambda: drain(naive)))
    tuned = DataLoader(folder, batch_size=BATCH, shuffle=True, num_workers=cores,
                       persistent_workers=True, prefetch_factor=4, worker_init_fn=one_thread)
    results.append(measure(f"hand-tuned DataLoader (workers={cores}), loose JPEG",
                           lambda: drain(tuned)))
    for name, path in packed.items():
        ld = feedpipe.make_loader(path, BATCH, size=SIZE, device="cpu",
                                  output=Output(dtype="uint8"))
        results.append(measure(f"make_loader {name} (workers={ld.config.num_workers})",
                               lambda ld=ld: drain(ld)))

    rate = {r.name: r.rate for r in results}
    naive_r = rate["naive DataLoader (workers=0), loose JPEG"]
    tuned_r = rate[f"hand-tuned DataLoader (workers={cores}), loose JPEG"]
    print("\nratios:")
    ratios = {}
    for r in results[len(per_core) + 2:]:
        ratios[r.name] = {"vs_naive": r.rate / naive_r, "vs_hand_tuned": r.rate / tuned_r,
                          "vs_decode_ceiling": r.rate / ceiling,
                          "vs_parallel_ceiling": r.rate / par}
        print(f"  {r.name:<44} {r.rate / naive_r:6.1f}x naive  {r.rate / tuned_r:5.2f}x "
              f"hand-tuned  {100 * r.rate / ceiling:5.1f}% of decode ceiling  "
              f"{100 * r.rate / par:5.1f}% of parallel ceiling")
    save(args.json, results, {"ceiling": ceiling, "parallel_ceiling": par, "ratios": ratios,
                              "images": args.images,
                              "size": SIZE, "batch": BATCH})
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
