"""Conversion throughput and output size per format (passthrough JPEG), one run side by side.

    python benchmarks/bench_convert.py [--images 3000] [--data bench-data]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import measure, save  # noqa: E402

from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/convert.json"))
    args = ap.parse_args()
    photos = args.data / f"photos-{args.images}"
    if not photos.exists():
        make_photos(photos, args.images, size=(500, 375), classes=7, seed=1)
    results, sizes = [], {}
    for fmt in ("lmdb", "hdf5", "wds"):
        out = args.data / f"convert-{fmt}"
        last = {}

        def run(fmt: str = fmt, out: Path = out) -> int:
            shutil.rmtree(out, ignore_errors=True)
            last["res"] = convert(photos, out, to=fmt)
            return last["res"].written

        r = measure(f"convert {fmt} passthrough", run)
        res = last["res"]
        sizes[fmt] = res.bytes_out / res.bytes_in
        r.note = f"output {sizes[fmt]:.3f}x input bytes"
        print(f"    {r.note}")
        results.append(r)
    save(args.json, results, {"size_ratio": sizes, "images": args.images})


if __name__ == "__main__":
    main()
