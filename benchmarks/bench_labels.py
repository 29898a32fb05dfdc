"""Ragged labels on the hot path: the loader on COCO-like data (JPEG photos with 0-50 boxes each)
with boxes against the same images alone, side by side in one run (interleaved rounds).

Random-resized-crop to 160², flip, batch 64; boxes padded (``Output(ragged="pad")``) and as
lists (``Output(ragged="list")``); in the main process (``num_workers=0``: the per-batch label cost shows
undiluted) and with 2 workers. Figures on a shared, loaded machine: read the ratios.

    python benchmarks/bench_labels.py [--images 768] [--data bench-data] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from feedpipe import Output

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Result, drain, measure_side_by_side, save  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe.loader.geometry import Geometry  # noqa: E402
from feedpipe.loader.labels import Collector  # noqa: E402
from feedpipe.loader.sampler import BatchRequest  # noqa: E402
from feedpipe.schema import BoxesField  # noqa: E402

SIZE, BATCH = 160, 64


def coco_like(root: Path, n: int, seed: int = 0) -> Path:
    """Photos plus an instances.json with 0-50 boxes per image (80 categories); the LMDB."""
    out = root / "coco.lmdb"
    if out.exists():  # made by an earlier run
        return out
    src = make_photos(root / "images", n, size=(320, 240), classes=1, seed=seed)
    rng = np.random.default_rng(seed)
    images, anns = [], []
    for k, p in enumerate(sorted(src.rglob("*.jpg"))):
        with Image.open(p) as im:
            w, h = im.size
        images.append({"id": k, "file_name": p.relative_to(src).as_posix(), "width": w,
                       "height": h})
        for _ in range(int(rng.integers(0, 51))):
            x, y = rng.uniform(0, w - 4), rng.uniform(0, h - 4)
            bw, bh = rng.uniform(2, w - x), rng.uniform(2, h - y)
            anns.append({"id": len(anns) + 1, "image_id": k, "category_id": int(rng.integers(1, 81)),
                         "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0,
                         "segmentation": []})
    cats = [{"id": i, "name": f"c{i}", "supercategory": "x"} for i in range(1, 81)]
    (root / "instances.json").write_text(json.dumps({"images": images, "annotations": anns,
                                                     "categories": cats}))
    convert(src, out, to="lmdb", coco=root / "instances.json")
    return out


def batch_cost(root: Path, repeats: int) -> list[Result]:
    """One worker's ``__getitems__`` per batch, image only against image + boxes, alternating
    batch by batch in this process (the cost a worker pays, without IPC or scheduling noise)."""
    base = dict(size=SIZE, crop="random_resized_crop", flip=True, device="cpu", seed=0,
                num_workers=0, output=Output(dtype="uint8", mean=None, std=None))
    sets = {"worker batch: image only": feedpipe.make_loader(root, BATCH, fields=["image"], **base),
            "worker batch: image + boxes": feedpipe.make_loader(root, BATCH,
                                                                fields=["image", "boxes"], **base)}
    n = len(sets["worker batch: image only"].batch_dataset) // BATCH
    out = {name: Result(name, BATCH) for name in sets}
    for r in range(repeats * 4):
        for name, ld in sets.items():
            req = BatchRequest(list(range((r % n) * BATCH, (r % n + 1) * BATCH)), 0, r, 0)
            t = time.perf_counter()
            ld.batch_dataset.__getitems__(req)  # type: ignore[attr-defined]
            out[name].seconds.append(time.perf_counter() - t)
    for res in out.values():
        print(f"  {res.name:<44} {res.rate:>10,.0f} /s", flush=True)
    return list(out.values())


def collate_cost(repeats: int = 200) -> dict[str, float]:
    """Milliseconds a worker spends on one batch's boxes alone (64 samples, 0-50 boxes each:
    copy out, transform, clip, drop, pad), timed directly: the figure noise cannot hide."""
    f = BoxesField("boxes", attrs=("iscrowd",))
    rng = np.random.default_rng(0)
    payloads = []
    for _ in range(BATCH):
        m = int(rng.integers(0, 51))
        xy = rng.uniform(0, 280, (m, 2))
        payloads.append(f.validate({"boxes": np.concatenate([xy, xy + 30], 1),
                                    "labels": rng.integers(0, 80, m), "iscrowd": np.zeros(m, int)}))
    geo = Geometry(10, 20, 200, 260, True)
    out = {}
    for ragged in ("pad", "list"):
        t = time.perf_counter()
        for _ in range(repeats):
            c = Collector(f, BATCH, (SIZE, SIZE), ragged, 0.2)  # type: ignore[arg-type]
            for pos, p in enumerate(payloads):
                c.put(pos, memoryview(p), geo, "boxes")
            c.finish()
        out[ragged] = (time.perf_counter() - t) / repeats * 1e3
        print(f"  boxes collate per batch ({ragged}): {out[ragged]:.2f} ms", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=768)
    ap.add_argument("--data", type=Path, default=Path("bench-data/labels"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/labels.json"))
    args = ap.parse_args()
    root = coco_like(args.data, args.images)
    base = dict(size=SIZE, crop="random_resized_crop", flip=True, device="cpu", seed=0,
                output=Output(dtype="uint8", mean=None, std=None))
    runs = {}
    for workers in (0, 2):
        for name, extra in (("image only", {"fields": ["image"]}),
                            ("image + boxes (pad)", {"fields": ["image", "boxes"]}),
                            ("image + boxes (list)", {"fields": ["image", "boxes"],
                                                      "output": Output(dtype="uint8", mean=None,
                                                                       std=None, ragged="list")})):
            loader = feedpipe.make_loader(root, BATCH, num_workers=workers, **{**base, **extra})
            runs[f"{name}, {workers} workers"] = lambda ld=loader: drain(ld)
    results = measure_side_by_side(runs, repeats=args.repeats)
    results += batch_cost(root, args.repeats)
    rate = {r.name: r.rate for r in results}
    ratios = {f"{kind}, {w} workers": rate[f"image + boxes ({kind}), {w} workers"]
              / rate[f"image only, {w} workers"] for kind in ("pad", "list") for w in (0, 2)}
    ratios["worker batch"] = rate["worker batch: image + boxes"] / rate["worker batch: image only"]
    for k, v in ratios.items():
        print(f"  boxes/image-only {k:<22} {v:.3f}")
    n_boxes = [int(c) for b in feedpipe.make_loader(root, BATCH, fields=["boxes"], shuffle=False,
                                                    num_workers=0, device="cpu")
               for c in b["boxes_count"]]
    save(args.json, results, {"ratios": ratios, "collate_ms_per_batch": collate_cost(), "images": args.images,
                              "boxes_per_image_mean": float(np.mean(n_boxes)),
                              "size": SIZE, "batch": BATCH})


if __name__ == "__main__":
    main()
