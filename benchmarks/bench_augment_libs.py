"""Another library's augmentation inside feedpipe vs in a plain DataLoader: its cost per sample.

The same JPEG photos, read two ways: feedpipe's loader over their LMDB conversion (decode and
224² centre crop in the loader, the library as ``transform=`` per sample or ``batch_transforms=``
per batch), and a plain ``torch.utils.data.DataLoader`` over the files (Pillow decode, the same
crop, the library called in ``__getitem__`` as its docs show, or on each collated batch). Each
way runs with and without the library, the four runs interleaved (A B C D A B C D ...), each
with one worker process on one thread (``--workers``) and the batch step in the main process on
one thread; the library's cost per sample is the time an epoch gains with it, over its samples:
the median over rounds of each round's difference. Inside feedpipe that cost includes the
adapter (layout, seeding, writing back).

    python benchmarks/bench_augment_libs.py [--images 256] [--batch 32] [--rounds 5]
                                            [--workers 1] [--json FILE]

albumentations and Kornia must import; torchvision's row is skipped where it does not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import one_thread, save  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe import Output  # noqa: E402

SIZE = 224


def pipelines() -> dict[str, tuple[str, Callable[[], Any]]]:
    """name: (where it runs: "sample" or "batch", a factory of the library's object)."""
    import albumentations as A
    import kornia.augmentation as K

    out: dict[str, tuple[str, Callable[[], Any]]] = {
        "albumentations: flip, brightness/contrast, affine": ("sample", lambda: A.Compose([
            A.HorizontalFlip(p=0.5), A.RandomBrightnessContrast(p=0.8),
            A.Affine(rotate=(-15, 15), p=0.5)])),
        "kornia: ColorJitter, RandomAffine (per batch)": ("batch", lambda: K.AugmentationSequential(
            K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8), K.RandomAffine(15, p=0.5))),
    }
    try:
        from torchvision.transforms import v2
    except Exception as exc:  # no wheel for this torch
        print(f"torchvision: skipped ({type(exc).__name__}: {exc})")
    else:
        out["torchvision v2: flip, ColorJitter, rotation"] = ("sample", lambda: v2.Compose([
            v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4), v2.RandomRotation(15)]))
    return out


class Files(torch.utils.data.Dataset):
    """The photos as a plain dataset: Pillow decode, resize and centre crop to 224², then the
    library on the H×W×C array (albumentations) or the C×H×W tensor (torchvision)."""

    def __init__(self, root: Path, aug: Any = None) -> None:
        self.paths = sorted(p for p in root.rglob("*.jpg"))
        self.classes = sorted({p.parent.name for p in self.paths})
        self.aug = aug
        self.kind = type(aug).__module__.partition(".")[0] if aug is not None else None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        p = self.paths[i]
        with Image.open(p) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = SIZE / min(w, h)
            im = im.resize((max(SIZE, round(w * s)), max(SIZE, round(h * s))), Image.BILINEAR)
            w, h = im.size
            left, top = (w - SIZE) // 2, (h - SIZE) // 2
            arr = np.asarray(im.crop((left, top, left + SIZE, top + SIZE)))
        if self.kind == "albumentations":
            arr = self.aug(image=arr)["image"]
        x = torch.from_numpy(np.array(arr)).permute(2, 0, 1)  # (Pillow's is read-only)
        if self.kind == "torchvision":
            x = self.aug(x)
        return x, self.classes.index(p.parent.name)


def epoch_dataloader(root: Path, batch: int, workers: int, where: str | None, aug: Any) -> int:
    ds = Files(root, aug if where == "sample" else None)
    n = 0
    for x, _ in torch.utils.data.DataLoader(ds, batch, shuffle=True, num_workers=workers,
                                            worker_init_fn=one_thread):
        x = x.float().div_(255)
        if where == "batch":
            x = aug(x)
        n += len(x)
    return n


def epoch_feedpipe(data: Path, batch: int, workers: int, where: str | None, aug: Any) -> int:
    kw: dict[str, Any] = {}
    if where == "sample":
        kw["transform"] = aug
    elif where == "batch":
        kw["batch_transforms"] = [aug]
    ld = feedpipe.make_loader(data, batch, size=SIZE, crop="center_crop", device="cpu",
                              num_workers=workers, output=Output(mean=None, std=None), **kw)
    n = sum(len(b["image"]) for b in ld)
    ld.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1, help="loader processes, each way")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/augment_libs.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    libs = pipelines()
    summary: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        photos = make_photos(Path(tmp) / "photos", args.images, size=(500, 375), seed=1)
        data = Path(tmp) / "lmdb"
        convert(photos, data, to="lmdb", workers=0)
        for name, (where, make) in libs.items():
            aug, w = make(), args.workers
            runs = {
                "feedpipe": partial(epoch_feedpipe, data, args.batch, w, None, None),
                "feedpipe + library": partial(epoch_feedpipe, data, args.batch, w, where, aug),
                "DataLoader": partial(epoch_dataloader, photos, args.batch, w, None, None),
                "DataLoader + library": partial(epoch_dataloader, photos, args.batch, w, where,
                                                aug),
            }
            for run in runs.values():  # warm-up
                run()
            seconds: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(args.rounds):
                for k, run in runs.items():
                    t = time.perf_counter()
                    n = run()
                    seconds[k].append(time.perf_counter() - t)
            per = {k: [1e3 * s / n for s in v] for k, v in seconds.items()}  # ms a sample
            cost = {way: statistics.median(a - b for a, b in zip(per[f"{way} + library"],
                                                                   per[way], strict=True))
                    for way in ("feedpipe", "DataLoader")}
            summary[name] = {**{f"{k} ms/sample": statistics.median(v) for k, v in per.items()},
                             **{f"library in {k} ms/sample": v for k, v in cost.items()}}
            print(f"{name} ({where}, {n} samples, median of {args.rounds} rounds):")
            for k, v in per.items():
                print(f"  {k:<24} {statistics.median(v):7.3f} ms/sample")
            print(f"  the library's cost: {cost['feedpipe']:.3f} ms/sample inside feedpipe, "
                  f"{cost['DataLoader']:.3f} in a DataLoader "
                  f"({cost['feedpipe'] / cost['DataLoader']:.2f}x)", flush=True)
    save(args.json, [], {"images": args.images, "batch": args.batch, "size": SIZE,
                         "workers": args.workers,
                         "rounds": args.rounds, "augment_libs": summary})


if __name__ == "__main__":
    main()
