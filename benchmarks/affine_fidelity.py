"""Pixel error and cost of the affine path's antialiasing threshold (``affine.AA_ABOVE``), measured.

Each photo is cut with random-resized-crop or centre crop to 224², flipped and put through a
``RandomAffine`` in feedpipe's one resampling step; the uint8 result is compared with a float64
reference rendered from the *full-resolution* decode: the same composed map sampled 4× per axis
(the source first reduced with the antialiased filter to 4× the output's density where it is
denser), then reduced 4× with the antialiased (triangle) filter. Pixels within 2 px of the fill
are left out (the fade differs). Prints mean / max absolute error in levels (0-255) and ms per
image, for several thresholds, for today's crop path (no affine) on the same photos, and for
the two-step pipeline feedpipe avoids (crop + resize to 224², then the affine on that image:
torchvision's ``Compose([RandomResizedCrop, RandomAffine])`` with bilinear interpolation).

    python benchmarks/affine_fidelity.py [--images 24] [--data bench-data] [--json FILE]

``--timing`` instead times decode + crop (+ affine) per 224² image, today's path against the
affine path on the same photos and plans' crops, interleaved rounds on one thread (median).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine  # noqa: E402

from converters.synth import make_photos  # noqa: E402
from feedpipe.loader import affine  # noqa: E402
from feedpipe.loader.transforms import Geometry, ImageOp, RandomAffine, _decode_jpeg  # noqa: E402

SIZE, K = 224, 4
# AA_ABOVE: the region is reduced (antialiased) to this many pixels per output pixel where it
# has more; "two-step": crop + resize to 224², then the affine on that (no antialiasing)
THRESHOLDS = {"none": float("inf"), "2.0": 2.0, "1.5": 1.5, "1.25": 1.25, "1.0": 1.0,
              "two-step": -1.0}
AFFINES = {"rotate+shear+scale 0.8-1.2": RandomAffine(30, (0.1, 0.1), (0.8, 1.2), 10),
           "zoom out 0.5-0.7": RandomAffine(15, None, (0.5, 0.7))}


def reference(full: np.ndarray, geo: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """float64 rendering of ``geo`` from the full decode, and the mask of pixels to compare."""
    box = full[geo.top: geo.top + geo.height, geo.left: geo.left + geo.width]
    h, w = box.shape[:2]
    m = geo.affine or affine.IDENTITY
    fx, fy = affine.footprint(m)
    x = torch.from_numpy(np.ascontiguousarray(box)).permute(2, 0, 1)[None].double()
    # at most 4× the output's density, antialiased, before point sampling
    th, tw = min(h, round(K * SIZE / fy)), min(w, round(K * SIZE / fx))
    if (th, tw) != (h, w):
        x = F.interpolate(x, size=(th, tw), mode="bilinear", antialias=True, align_corners=False)
    big = SIZE * K
    ys, xs = np.mgrid[0:big, 0:big]
    q = np.stack([(xs + 0.5) / K, (ys + 0.5) / K, np.ones((big, big))], -1).reshape(-1, 3)
    p = (q @ affine._to_region(m, geo.flip, SIZE, SIZE, 2.0, 2.0).T - 1).reshape(1, big, big, 2)
    y = F.grid_sample(x, torch.from_numpy(p), mode="bilinear", padding_mode="border",
                      align_corners=False)
    inside = torch.from_numpy((np.abs(p) <= 1).all(-1)[:, None].astype(np.float64))
    y = F.interpolate(y * inside, size=(SIZE, SIZE), mode="bilinear", antialias=True,
                      align_corners=False)[0].permute(1, 2, 0).numpy()
    # compare where a 5×5 neighbourhood of the supersampled coverage is whole
    cover = F.avg_pool2d(inside, K * 5, K, padding=2 * K, count_include_pad=True)[0, 0]
    return y, cover.numpy()[:SIZE, :SIZE] > 0.9999


def measure(blobs: list[bytes], crop: str, aff: RandomAffine | None,
            threshold: float) -> dict[str, float]:
    two_step = threshold < 0
    affine.AA_ABOVE = float("inf") if two_step else threshold
    op = ImageOp((SIZE, SIZE), crop, flip=True, affine=aff)  # type: ignore[arg-type]
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    errs, maxes, seconds = [], [], 0.0
    rng = np.random.default_rng(0)
    for b in blobs:
        t = time.perf_counter()
        geo = op.apply(b, "jpeg", out, rng, "image")
        seconds += time.perf_counter() - t
        if two_step and geo.affine is not None:  # the same plan, as two resamplings
            src = _decode_jpeg(b, *simplejpeg.decode_jpeg_header(b)[:2], geo.dct)
            resized = np.empty_like(out)
            op._cut(src, resized, geo._replace(affine=None), geo.dct, "image")
            affine.warp_image(resized, out, geo.affine, False)
        ref, keep = reference(simplejpeg.decode_jpeg(b, colorspace="RGB"), geo)
        d = np.abs(out.astype(np.float64) - ref)[keep]
        errs.append(d.mean())
        maxes.append(d.max())
    return {"mean_abs": float(np.mean(errs)), "max_abs": float(np.max(maxes)),
            "ms_per_image": 1e3 * seconds / len(blobs)}


def timing(blobs: list[bytes], crop: str, rounds: int = 5) -> dict[str, float]:
    """Median ms per image of ``apply`` without and with the rotate+shear+scale affine."""
    ops = {"today": ImageOp((SIZE, SIZE), crop, flip=True),  # type: ignore[arg-type]
           "affine": ImageOp((SIZE, SIZE), crop, flip=True,  # type: ignore[arg-type]
                             affine=AFFINES["rotate+shear+scale 0.8-1.2"])}
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    times: dict[str, list[float]] = {k: [] for k in ops}
    for _ in range(rounds):
        for name, op in ops.items():
            rng = np.random.default_rng(0)
            t = time.perf_counter()
            for b in blobs:
                op.apply(b, "jpeg", out, rng, "image")
            times[name].append(1e3 * (time.perf_counter() - t) / len(blobs))
    return {k: float(np.median(v)) for k, v in times.items()}


def photo_blobs(data: Path, label: str, size: tuple[int, int], n: int) -> list[bytes]:
    """The ``n`` generated photos of ``size`` (made once under ``data``), as JPEG bytes."""
    photos = data / f"fidelity-{label}-{n}"
    if not photos.exists():
        make_photos(photos, n, size=size, classes=7, seed=5)
    return [p.read_bytes() for p in sorted(photos.rglob("*.jpg"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=24)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/affine_fidelity.json"))
    ap.add_argument("--timing", action="store_true", help="time today's path against the affine")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.timing:
        print("| photos | crop | today ms/image | affine ms/image | × |\n|---|---|---|---|---|")
        for label, size in (("500x375", (500, 375)), ("1280x853", (1280, 853))):
            blobs = photo_blobs(args.data, label, size, args.images)
            for crop in ("random_resized_crop", "center_crop"):
                r = timing(blobs, crop)
                print(f"| {label} | {crop} | {r['today']:.2f} | {r['affine']:.2f} | "
                      f"{r['affine'] / r['today']:.2f} |", flush=True)
        return
    report: dict[str, dict] = {}
    print("| photos | crop | affine | AA above | mean abs (levels) | max abs | ms/image |")
    print("|---|---|---|---|---|---|---|")
    for label, size in (("500x375", (500, 375)), ("1280x853", (1280, 853))):
        blobs = photo_blobs(args.data, label, size, args.images)
        for crop in ("random_resized_crop", "center_crop"):
            runs = [("no affine (today)", None, "-")] + [
                (name, aff, t) for name, aff in AFFINES.items() for t in THRESHOLDS]
            for name, aff, t in runs:
                r = measure(blobs, crop, aff, THRESHOLDS.get(t, float("inf")))
                report[f"{label} {crop} {name} {t}"] = r
                print(f"| {label} | {crop} | {name} | {t} | {r['mean_abs']:.3f} | "
                      f"{r['max_abs']:.1f} | {r['ms_per_image']:.2f} |", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": machine(), "results": report}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
