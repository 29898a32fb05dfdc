"""The conversion's JPEG check: what each way of finding a damaged JPEG costs, and what it finds.

On the conversion benchmark's photos (``converters.synth.make_photos``, ~500×375, as
bench_convert.py) and the same photos made progressive (``turbojpeg.transform``, lossless), each
candidate check runs on every file: CPU time per image (``time.process_time``: neighbours' load
moves it little), median of interleaved rounds. Then each runs on damaged copies of the files: cut
at a random point with the end marker put back, and 600 bytes cut from the middle of the scan data
(end marker intact); "found" is the share it refuses. The candidates:

- ``header``: the marker parse and end-of-image check (``imaging.jpeg_problem``), no decode;
- ``simplejpeg full``: a full strict RGB decode (``strict=True``: libjpeg-turbo's warnings raise);
- ``simplejpeg 1/8 RGB`` and ``1/8 grey`` (chosen: ``imaging.read_jpeg_whole``): the DCT-scaled
  decode reads every scan in full; the inverse DCT is the DC alone, grey skips the colour
  conversion;
- ``turbojpeg coefficients``: the lossless transform with no output (``jpeg_read_coefficients``:
  entropy decoding only, into whole-image coefficient arrays);
- ``Pillow draft 1/8``: Pillow's scaled decode, which ignores libjpeg's warnings.

    python benchmarks/bench_jpeg_check.py [--images 200] [--rounds 5] [--data bench-data]
                                          [--json benchmarks/results/jpeg_check.json]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import simplejpeg
import turbojpeg
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine  # noqa: E402

from converters.synth import make_photos  # noqa: E402
from feedpipe.schema.imaging import jpeg_problem  # noqa: E402


def _header(b: bytes) -> None:
    if jpeg_problem(b)[1] is not None:
        raise ValueError(jpeg_problem(b)[1])


def _pillow(b: bytes) -> None:
    with Image.open(io.BytesIO(b)) as im:
        im.draft("RGB", (im.size[0] // 8, im.size[1] // 8))
        im.load()


CHECKS: dict[str, Callable[[bytes], object]] = {
    "header": _header,
    "simplejpeg full": lambda b: simplejpeg.decode_jpeg(b, "RGB"),
    "simplejpeg 1/8 RGB": lambda b: simplejpeg.decode_jpeg(b, "RGB", min_factor=8, min_height=1,
                                                           min_width=1),
    "simplejpeg 1/8 grey (chosen)": lambda b: simplejpeg.decode_jpeg(
        b, "GRAY", min_factor=8, min_height=1, min_width=1),
    "turbojpeg coefficients": lambda b: turbojpeg.transform(b, nooutput=True),
    "Pillow draft 1/8": _pillow,
}


def damaged(blobs: list[bytes], seed: int = 0) -> list[bytes]:
    """Each file cut at a random point after its first scan with the end marker put back, and
    with 600 bytes cut from the middle of its scan data."""
    rng = np.random.default_rng(seed)
    out = []
    for b in blobs:
        sos = b.find(b"\xff\xda") + 20
        out.append(b[: int(rng.integers(sos, len(b) - 2))] + b"\xff\xd9")
        mid = (b.rfind(b"\xff\xda") + len(b)) // 2
        out.append(b[:mid] + b[mid + 600:])
    return out


def refuses(check: Callable[[bytes], object], b: bytes) -> bool:
    try:
        check(b)
    except (ValueError, RuntimeError, OSError):
        return True
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/jpeg_check.json"))
    args = ap.parse_args()
    photos = args.data / f"check-photos-{args.images}"
    if not photos.exists():
        make_photos(photos, args.images, classes=7, seed=1)
    base = [p.read_bytes() for p in sorted(photos.rglob("*.jpg"))]
    sets = {"baseline": base, "progressive": [turbojpeg.transform(b, progressive=True)
                                              for b in base]}
    rows: dict[str, dict[str, float]] = {}
    for kind, blobs in sets.items():
        times: dict[str, list[float]] = {name: [] for name in CHECKS}
        for _ in range(args.rounds):  # interleaved: a slow spell hits every check alike
            for name, check in CHECKS.items():
                t = time.process_time()
                for b in blobs:
                    check(b)
                times[name].append((time.process_time() - t) / len(blobs))
        bad = damaged(blobs)
        for name, check in CHECKS.items():
            rows[f"{kind} | {name}"] = {
                "us": 1e6 * float(np.median(times[name])),
                "found": sum(refuses(check, b) for b in bad) / len(bad)}
    print(f"{len(base)} photos, {sum(map(len, base)) / len(base) / 1e3:.1f} kB mean; "
          f"{args.rounds} rounds")
    print("| files | check | CPU µs / image | × full decode | damaged copies found |")
    print("|---|---|---|---|---|")
    for key, r in rows.items():
        kind, name = key.split(" | ")
        full = rows[f"{kind} | simplejpeg full"]["us"]
        print(f"| {kind} | {name} | {r['us']:.0f} | {r['us'] / full:.2f} | "
              f"{100 * r['found']:.0f}% |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": machine(), "images": len(base),
                                     "rounds": args.rounds, "results": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
