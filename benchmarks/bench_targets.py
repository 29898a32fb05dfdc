"""Precomputed targets versus computing them on the fly, side by side.

On real-looking ~500×375 photos with blob masks packed as LMDB (image JPEG passthrough, raw mask,
signed distance map truncated at 20 px stored float16):

- per-image cost of the distance map: computed on the fly (scipy EDT on the augmented 224×224
  mask, as a boundary-loss training loop does) versus loaded precomputed (read + crop/resize);
- loader throughput for 224×224 batches of 64: images only; image+mask+distance map loaded
  precomputed (``make_loader``); and image+mask from the same dataset with the distance map
  computed in the DataLoader workers (the usual on-the-fly pipeline, same worker count).

    python benchmarks/bench_targets.py [--images 1000] [--data bench-data] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from feedpipe import Output

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Result, drain, measure, measure_side_by_side, one_thread, save  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert, make_distance_map  # noqa: E402
from converters.synth import make_segmentation  # noqa: E402
from converters.targets import distance_map  # noqa: E402
from feedpipe.loader.config import usable_cores  # noqa: E402
from feedpipe.loader.transforms import ImageOp  # noqa: E402

SIZE, BATCH, TRUNCATE = 224, 64, 20.0


class OnTheFly(Dataset):
    """Reads image+mask from the packed dataset, augments both, computes the distance map."""

    def __init__(self, path: Path) -> None:
        self.ds = feedpipe.open_dataset(path)
        self.op = ImageOp((SIZE, SIZE), "center_crop")

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raw = self.ds.read_raw(i)
        img = np.empty((SIZE, SIZE, 3), np.uint8)
        mask = np.empty((SIZE, SIZE), np.uint8)
        geo = self.op.apply(raw["image"], "jpeg", img, None, "image")
        self.op.apply_mask(self.ds.schema["mask"].to_user(raw["mask"], "mask"), geo, mask, "mask")
        dist = distance_map(mask, signed=True, truncate=TRUNCATE)
        return torch.from_numpy(img), torch.from_numpy(mask), torch.from_numpy(dist)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/targets.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    cores = usable_cores()
    src = args.data / f"seg-{args.images}"
    if not src.exists():
        print(f"generating {args.images} photo/mask pairs (~500x375) in {src}")
        make_segmentation(src, args.images, size=(500, 375), classes=4, seed=2)
    packed = args.data / f"seg-lmdb-{args.images}"
    if not packed.exists():
        t = time.perf_counter()
        res = convert(src / "images", packed, to="lmdb", masks=src / "masks",
                      targets=[make_distance_map(signed=True, truncate=TRUNCATE)])
        print(f"packed {res.written} samples with distance maps in {time.perf_counter() - t:.1f} s "
              f"({res.rate:.0f}/s on {cores} cores)")

    results: list[Result] = []
    print(f"\nper-image cost of the distance map, one core ({SIZE}x{SIZE} output):")
    ds = feedpipe.open_dataset(packed)
    op = ImageOp((SIZE, SIZE), "center_crop")
    field = ds.schema["distance_map"]
    samples = [ds.read_raw(i) for i in range(min(300, len(ds)))]
    img = np.empty((SIZE, SIZE, 3), np.uint8)
    mask = np.empty((SIZE, SIZE), np.uint8)
    dist = np.empty((SIZE, SIZE), np.float16)
    geos = [op.apply(s["image"], "jpeg", img, None, "image") for s in samples]
    masks = []
    for s, g in zip(samples, geos, strict=True):
        op.apply_mask(ds.schema["mask"].to_user(s["mask"], "mask"), g, mask, "mask")
        masks.append(mask.copy())

    def compute() -> int:
        for m in masks:
            distance_map(m, signed=True, truncate=TRUNCATE)
        return len(masks)

    def load() -> int:
        for i in range(len(samples)):  # read + decode the stored record + crop/resize
            stored = ds.read_raw(i)["distance_map"]
            op.apply_target(stored, field, geos[i], dist, "distance_map")
        return len(samples)

    results.append(measure("compute on the fly (EDT of the 224x224 mask)", compute))
    results.append(measure("load precomputed (read + crop/resize)", load))
    per_image = results[0].rate, results[1].rate
    print(f"  -> loading is {per_image[1] / per_image[0]:.1f}x faster per image")

    print(f"\nloader throughput, batch {BATCH}, {cores} workers (images/s):")
    only = feedpipe.make_loader(packed, BATCH, size=SIZE, fields=["image"], device="cpu",
                                num_workers=cores, output=Output(dtype="uint8"))
    seg = feedpipe.make_loader(packed, BATCH, size=SIZE, fields=["image", "mask", "distance_map"],
                               device="cpu", num_workers=cores, output=Output(dtype="uint8"))
    fly = DataLoader(OnTheFly(packed), batch_size=BATCH, shuffle=True, num_workers=cores,
                     persistent_workers=True, prefetch_factor=4, worker_init_fn=one_thread)
    results += measure_side_by_side({
        "make_loader image only": lambda: drain(only),
        "make_loader image+mask+distance_map (precomputed)": lambda: drain(seg),
        "DataLoader image+mask, distance map on the fly": lambda: drain(fly)})
    r_only, r_seg, r_fly = (r.rate for r in results[2:])
    cost = 1 - r_seg / r_only
    print(f"\n  precomputed targets cost {100 * cost:.1f}% of image-only throughput (aim < 20%)")
    print(f"  precomputed is {r_seg / r_fly:.2f}x the on-the-fly loader's throughput; the "
          f"distance map itself loads {per_image[1] / per_image[0]:.1f}x faster than it computes "
          "(aim >= 3x)")
    save(args.json, results, {"images": len(ds), "size": SIZE, "batch": BATCH,
                              "truncate": TRUNCATE, "cost_vs_image_only": cost,
                              "precomputed_vs_on_the_fly_loader": r_seg / r_fly,
                              "per_image_load_vs_compute": per_image[1] / per_image[0]})
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
