"""Pixel error of the DCT-domain downscale margin (ImageOp._dct_factor), measured.

For each photo and crop, feedpipe's output (uint8) is compared with a float64 antialiased bilinear
resize of the *full-resolution* decode over the same box (the box feedpipe reports, snapped to
its DCT grid), for margins 1×, 1.5×, 2× and for no DCT scaling at all. Prints, per set, crop and
margin, the mean absolute error in levels (0-255), the distribution of the per-image means
(median, 90th and 99th percentile, worst image), the 99.9th percentile of all pixels' errors and
the worst pixel, and the CPU time per image of feedpipe's decode + resize at each margin
(``time.process_time``, one thread: it holds on a busy machine); writes JSON.

Sets: ``web`` is the real-photo mix (``converters.synth.make_web_photos``: real photographs' own
pixels, 640-4000 px, 40% progressive, 4:2:0 and 4:4:4, quality 75-95; benchmarks/README.md),
its progressive files made baseline as conversion stores them (the same pixels: only the times
change); the others are ``make_photos`` at one size (upscaled crops: smoother than camera photos).

    python benchmarks/dct_fidelity.py [--web-images 210] [--images 48] [--sets web 1280x853 ...]
                                      [--data bench-data] [--json FILE]
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

from converters.progressive import to_baseline  # noqa: E402
from converters.synth import jpeg_mix, make_photos, make_web_photos  # noqa: E402
from feedpipe.loader.transforms import Geometry, ImageOp  # noqa: E402
from feedpipe.schema.codecs import JPEG_PROGRESSIVE, jpeg_frame  # noqa: E402

SIZE = 224
MARGINS = {"no DCT scaling": 1e9, "2x": 2.0, "1.5x": 1.5, "1x": 1.0}
CROPS = ("center_crop", "random_resized_crop", "resize")
SETS = {"web": None, "500x375": (500, 375), "1280x853": (1280, 853), "2000x1500": (2000, 1500)}
BINS = np.arange(0, 256.25, 0.25)  # the pixel-error histogram's edges, levels


def reference(full: np.ndarray, geo: Geometry) -> np.ndarray:
    """float64 antialiased bilinear resize of the full-resolution box, flipped like the output."""
    box = full[geo.top: geo.top + geo.height, geo.left: geo.left + geo.width]
    x = torch.from_numpy(np.ascontiguousarray(box)).permute(2, 0, 1)[None].double()
    y = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", antialias=True,
                      align_corners=False)[0].permute(1, 2, 0).numpy()
    return y[:, ::-1] if geo.flip else y


class Errors:
    """One (crop, margin)'s errors over a set: per-image means, a pixel histogram, the time."""

    def __init__(self, crop: str, margin: float) -> None:
        self.op = ImageOp((SIZE, SIZE), crop, dct_margin=margin)  # type: ignore[arg-type]
        self.rng = np.random.default_rng(0)  # the same boxes for every margin
        self.means: list[float] = []
        self.hist = np.zeros(len(BINS) - 1, np.int64)
        self.worst, self.seconds = 0.0, 0.0

    def add(self, blob: bytes, full: np.ndarray, out: np.ndarray) -> None:
        t = time.process_time()
        geo = self.op.apply(blob, "jpeg", out, self.rng, "image")
        self.seconds += time.process_time() - t
        d = np.abs(out.astype(np.float64) - reference(full, geo))
        self.means.append(float(d.mean()))
        self.worst = max(self.worst, float(d.max()))
        self.hist += np.histogram(d, BINS)[0]

    def summary(self) -> dict[str, float]:
        cum = np.cumsum(self.hist) / self.hist.sum()
        p50, p90, p99 = np.percentile(self.means, [50, 90, 99])
        return {"mean_abs": float(np.mean(self.means)), "image_p50": float(p50),
                "image_p90": float(p90), "image_p99": float(p99),
                "worst_image": float(np.max(self.means)),
                "pixel_p99_9": float(BINS[1:][np.searchsorted(cum, 0.999)]),
                "max_abs": self.worst, "images": len(self.means),
                "cpu_ms_per_image": 1e3 * self.seconds / len(self.means)}


def photo_set(data: Path, label: str, n: int) -> list[Path]:
    """The set's JPEG files (made once, reused)."""
    size = SETS[label]
    photos = data / f"fidelity-{label}-{n}"
    if not photos.exists():
        if size is None:
            make_web_photos(photos, n, classes=7, seed=5)
        else:
            make_photos(photos, n, size=size, classes=7, seed=5)
    return sorted(photos.rglob("*.jpg"))


def measure(files: list[Path]) -> dict[str, dict[str, float]]:
    """Every crop and margin over ``files``; each full-resolution decode is made once."""
    errs = {(c, m): Errors(c, v) for c in CROPS for m, v in MARGINS.items()}
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    for p in files:
        blob = p.read_bytes()
        if jpeg_frame(blob)[4] in JPEG_PROGRESSIVE:  # as stored: made baseline, same pixels
            blob = to_baseline(blob)[0] or blob
        full = simplejpeg.decode_jpeg(blob, colorspace="RGB")
        for e in errs.values():
            e.add(blob, full, out)
    return {f"{c} {m}": e.summary() for (c, m), e in errs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--web-images", type=int, default=210, help="real-photo mix (30 a photograph)")
    ap.add_argument("--images", type=int, default=48, help="generated photos per size")
    ap.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS))
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/dct_fidelity.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    report: dict[str, dict] = {}
    print("| photos | crop | margin | mean abs | per image: median / p90 / p99 / worst | "
          "pixel p99.9 | worst pixel | CPU ms/image |")
    print("|---|---|---|---|---|---|---|---|")
    for label in args.sets:
        files = photo_set(args.data, label, args.web_images if label == "web" else args.images)
        if label == "web":
            report["web mix"] = jpeg_mix(files)
            print(f"web photo mix: {report['web mix']}", flush=True)
        for key, r in measure(files).items():
            report[f"{label} {key}"] = r
            crop, margin = key.split(" ", 1)
            print(f"| {label} | {crop} | {margin} | {r['mean_abs']:.2f} | {r['image_p50']:.2f} / "
                  f"{r['image_p90']:.2f} / {r['image_p99']:.2f} / {r['worst_image']:.2f} | "
                  f"{r['pixel_p99_9']:.2f} | {r['max_abs']:.0f} | {r['cpu_ms_per_image']:.2f} |",
                  flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": machine(), "results": report}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
