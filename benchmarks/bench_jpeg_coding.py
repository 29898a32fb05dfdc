"""What a JPEG's entropy coding costs the loader's decode ("restart markers or anything
else the decode path can exploit, measured").

For each photo of the real-photo mix (``converters.synth.make_web_photos``), the same image is
coded several ways and each is decoded as the loader does (simplejpeg, full size and at the DCT
scale a 224² centre crop gets); CPU time per image (``time.process_time``, so neighbours' load
moves it little), median of the rounds, and the bytes:

- lossless (same coefficients, the pixels of the file as it is): progressive; baseline with
  optimized Huffman tables (what ``--jpeg baseline`` stores); baseline with the standard tables;
  arithmetic coding;
- re-encoded from the decoded pixels by Pillow at the file's quality and subsampling (pixels
  change: only the two against each other say something): without and with a restart marker
  every MCU row (``restart_marker_rows=1``), the markers libjpeg-turbo could use to skip or
  split entropy decoding;
- decoder options on the baseline file: ``fastdct`` and ``fastupsample`` (pixels change: the
  mean error against the exact decode is printed too).

    python benchmarks/bench_jpeg_coding.py [--images 42] [--rounds 5] [--data bench-data]
                                           [--json benchmarks/results/jpeg_coding.json]
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

from converters.synth import jpeg_mix, make_web_photos  # noqa: E402
from feedpipe.loader.transforms import ImageOp  # noqa: E402

SIZE = 224
SAMPLING = {"444": 0, "422": 1, "420": 2}


def recoded(blob: bytes, **save: object) -> bytes:
    """``blob``'s pixels re-encoded by Pillow at its own quantization tables and subsampling."""
    with Image.open(io.BytesIO(blob)) as im:
        tables = im.quantization
        sub = SAMPLING.get(simplejpeg.decode_jpeg_header(blob)[3], 2)
        out = io.BytesIO()
        im.convert("RGB").save(out, "JPEG", qtables=tables, subsampling=sub, **save)
    return out.getvalue()


def variants(blob: bytes) -> dict[str, bytes]:
    return {
        "progressive (lossless)": turbojpeg.transform(blob, progressive=True),
        "baseline, optimized tables (lossless; stored)": turbojpeg.transform(blob, optimize=True),
        "baseline, standard tables (lossless)": turbojpeg.transform(blob),
        "arithmetic (lossless)": turbojpeg.transform(blob, arithmetic=True),
        "re-encoded": recoded(blob),
        "re-encoded, restart every MCU row": recoded(blob, restart_marker_rows=1),
    }


def decoders(blob: bytes) -> dict[str, Callable[[bytes], np.ndarray]]:
    """Full decode and the DCT-scaled one a 224² centre crop gets (the loader's factor)."""
    h, w = simplejpeg.decode_jpeg_header(blob)[:2]
    s = min(h, w)
    f = ImageOp._dct_factor(s, s, (SIZE, SIZE))
    return {"full": lambda b: simplejpeg.decode_jpeg(b, "RGB"),
            "centre-crop scale": lambda b: simplejpeg.decode_jpeg(
                b, "RGB", min_height=h // f, min_width=w // f)}


def cpu_ms(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return 1e3 * float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=42)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/jpeg_coding.json"))
    args = ap.parse_args()
    photos = args.data / f"coding-web-{args.images}"
    if not photos.exists():
        make_web_photos(photos, args.images, classes=7, seed=3)
    files = sorted(photos.rglob("*.jpg"))
    rows: dict[str, dict[str, float]] = {}
    for p in files:
        blob = p.read_bytes()
        decs = decoders(blob)
        for name, data in variants(blob).items():
            for dname, dec in decs.items():
                ms = cpu_ms(lambda d=data, f=dec: f(d), args.rounds)
                r = rows.setdefault(f"{name} | {dname}", {"ms": 0.0, "bytes": 0.0, "err": 0.0})
                r["ms"] += ms / len(files)
                r["bytes"] += len(data) / len(files)
        base = turbojpeg.transform(blob, optimize=True)
        exact = simplejpeg.decode_jpeg(base, "RGB").astype(np.int16)
        for opt in ("fastdct", "fastupsample"):
            ms = cpu_ms(lambda o=opt, b=base: simplejpeg.decode_jpeg(b, "RGB", **{o: True}),
                        args.rounds)
            err = np.abs(simplejpeg.decode_jpeg(base, "RGB", **{opt: True}) - exact).mean()
            r = rows.setdefault(f"baseline, {opt} | full", {"ms": 0.0, "bytes": 0.0, "err": 0.0})
            r["ms"] += ms / len(files)
            r["bytes"] += len(base) / len(files)
            r["err"] += float(err) / len(files)
    ref = rows["baseline, optimized tables (lossless; stored) | full"]["ms"]
    print(f"{len(files)} photos: {jpeg_mix(files)}")
    print("| coding | decode | CPU ms / image | × stored baseline (full) | kB / image | "
          "mean error vs exact (levels) |")
    print("|---|---|---|---|---|---|")
    for key, r in rows.items():
        coding, dec = key.split(" | ")
        err = f"{r['err']:.2f}" if coding.startswith("baseline, fast") else "—"
        print(f"| {coding} | {dec} | {r['ms']:.2f} | {r['ms'] / ref:.2f} | "
              f"{r['bytes'] / 1e3:.0f} | {err} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": machine(), "mix": jpeg_mix(files),
                                     "rounds": args.rounds, "results": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
