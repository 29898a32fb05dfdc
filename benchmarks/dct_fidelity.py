"""Pixel error of the DCT-domain downscale margin (ImageOp._dct_factor), measured (issue 13).

For each photo and crop, feedpipe's output (uint8) is compared with a float64 antialiased bilinear
resize of the *full-resolution* decode over the same box (the box feedpipe reports, snapped to
its DCT grid), for margins 1×, 1.5×, 2× and for no DCT scaling at all. Prints mean and max
absolute error in levels (0-255) and the speed of each margin; writes JSON.

    python benchmarks/dct_fidelity.py [--images 64] [--data bench-data] [--json FILE]
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
from feedpipe.loader.transforms import Geometry, ImageOp  # noqa: E402

SIZE = 224
MARGINS = {"no DCT scaling": 1e9, "2x": 2.0, "1.5x": 1.5, "1x": 1.0}


def reference(full: np.ndarray, geo: Geometry) -> np.ndarray:
    """float64 antialiased bilinear resize of the full-resolution box, flipped like the output."""
    box = full[geo.top: geo.top + geo.height, geo.left: geo.left + geo.width]
    x = torch.from_numpy(np.ascontiguousarray(box)).permute(2, 0, 1)[None].double()
    y = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", antialias=True,
                      align_corners=False)[0].permute(1, 2, 0).numpy()
    return y[:, ::-1] if geo.flip else y


def measure(blobs: list[bytes], crop: str, margin: float) -> dict[str, float]:
    op = ImageOp((SIZE, SIZE), crop, dct_margin=margin)  # type: ignore[arg-type]
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    errs, maxes, seconds = [], [], 0.0
    rng = np.random.default_rng(0)
    for b in blobs:
        t = time.perf_counter()
        geo = op.apply(b, "jpeg", out, rng, "image")
        seconds += time.perf_counter() - t
        full = simplejpeg.decode_jpeg(b, colorspace="RGB")
        d = np.abs(out.astype(np.float64) - reference(full, geo))
        errs.append(d.mean())
        maxes.append(d.max())
    return {"mean_abs": float(np.mean(errs)), "max_abs": float(np.max(maxes)),
            "p99_image_mean": float(np.percentile(errs, 99)),
            "ms_per_image": 1e3 * seconds / len(blobs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/dct_fidelity.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    report: dict[str, dict] = {}
    print("| photos | crop | margin | mean abs (levels) | max abs | ms/image |")
    print("|---|---|---|---|---|---|")
    for label, size in (("500x375", (500, 375)), ("1280x853", (1280, 853)),
                        ("2000x1500", (2000, 1500))):
        photos = args.data / f"fidelity-{label}-{args.images}"
        if not photos.exists():
            make_photos(photos, args.images, size=size, classes=7, seed=5)
        blobs = [p.read_bytes() for p in sorted(photos.rglob("*.jpg"))]
        for crop in ("center_crop", "random_resized_crop"):
            for name, margin in MARGINS.items():
                r = measure(blobs, crop, margin)
                report[f"{label} {crop} {name}"] = r
                print(f"| {label} | {crop} | {name} | {r['mean_abs']:.3f} | {r['max_abs']:.1f} | "
                      f"{r['ms_per_image']:.2f} |", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": machine(), "results": report}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
