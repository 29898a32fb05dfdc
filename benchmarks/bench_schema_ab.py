"""The schema layer's per-record decoders with this checkout against another one, side by side:
npy arrays whose header is parsed (a variable-shape field), mask PNGs (uint8 and uint16) and an
RGB PNG through Pillow. Each round runs each checkout in a fresh process (rounds interleaved, so
a slow spell on a shared machine hits both alike); the figure is CPU µs a call (process time,
which other processes' load moves least), best of three repeats, medians of rounds.

    python benchmarks/bench_schema_ab.py --baseline /path/to/checkout [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_RUN = """
import io, json, time, timeit
import numpy as np
from PIL import Image
from feedpipe.schema.codecs import npy_decode, npy_encode
from feedpipe.schema.imaging import decode_mask_png, decode_with_pillow, encode_mask_png

rng = np.random.default_rng(0)
npy = npy_encode(rng.random((17, 5), dtype=np.float32))
hlen = int.from_bytes(npy[8:10], "little")  # npy2: the same array as npy version 2 (u32 length)
npy2 = npy[:6] + bytes([2, 0]) + (hlen + 2).to_bytes(4, "little") + npy[10:10 + hlen] + b"  " \\
    + npy[10 + hlen:]
mask8 = encode_mask_png(rng.integers(0, 21, (256, 256), dtype=np.uint8))
mask16 = encode_mask_png(rng.integers(0, 900, (256, 256), dtype=np.uint16))
out = io.BytesIO()
Image.fromarray(rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)).save(out, "PNG")
png = out.getvalue()
cases = {"npy v1 header": lambda: npy_decode(npy), "npy v2 header": lambda: npy_decode(npy2),
         "mask png uint8": lambda: decode_mask_png(mask8, "m"),
         "mask png uint16": lambda: decode_mask_png(mask16, "m"),
         "rgb png (Pillow)": lambda: decode_with_pillow(png)}
cpu = time.process_time
print(json.dumps({k: min(timeit.repeat(f, cpu, number=n, repeat=3)) / n * 1e6 for (k, f), n in
                  zip(cases.items(), (20000, 20000, 100, 100, 100), strict=True)}))
"""


def run(checkout: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run([sys.executable, "-c", _RUN], env=env, check=True, capture_output=True,
                         text=True, cwd=checkout)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    here = Path(__file__).resolve().parent.parent
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
    for _ in range(args.rounds):
        runs["baseline"].append(run(args.baseline))
        runs["this"].append(run(here))
    print(f"{'µs a call (median of rounds)':32} {'baseline':>10} {'this':>10}")
    for case in runs["this"][0]:
        old, new = (statistics.median(r[case] for r in runs[k]) for k in ("baseline", "this"))
        print(f"{case:32} {old:10.2f} {new:10.2f}")


if __name__ == "__main__":
    main()
