"""What the per-record crc32 costs on the read path, side by side in one run.

The same packed photos in each format, as written (format v2: a crc32 per record and field,
checked on every read) and rewritten as format v1 (no checksums). Measured interleaved, median of
``--repeats``: zlib.crc32 alone on the stored JPEGs, the format reader alone (``visit`` over every
sample, no decode), and ``make_loader`` (decode + 224² center crop, ``num_workers=0``). Raw
(decoded, 150 KB) LMDB records show the worst case: no decode to hide the check behind.

    python benchmarks/bench_checksum.py [--images 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from feedpipe import Output

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from fp_helpers import downgrade_to_v1  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe.schema.codecs import crc32  # noqa: E402 - the one the readers use


def read_all(path: Path, seconds: float = 0.5) -> float:
    """Samples/s of the reader alone: every record visited (and crc-checked in v2), no decode;
    whole passes for at least ``seconds``."""
    ds = feedpipe.open_dataset(path)
    n, t = 0, time.perf_counter()
    while n == 0 or time.perf_counter() - t < seconds:
        for start in range(0, len(ds), 256):
            ds.visit(range(start, min(start + 256, len(ds))), lambda pos, stored: None)
        n += len(ds)
    return n / (time.perf_counter() - t)


def load_all(path: Path) -> float:
    """Samples/s of make_loader (decode + 224 center crop, main process)."""
    ld = feedpipe.make_loader(path, 64, size=224, num_workers=0, device="cpu", shuffle=False,
                              output=Output(dtype="uint8", mean=None, std=None))
    t = time.perf_counter()
    n = sum(len(b["label"]) for b in ld)
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="feedpipe-crc-"))
    try:
        src = make_photos(work / "src", args.images, size=(500, 375), classes=4, seed=0)
        jpegs = [p.read_bytes() for p in sorted(src.rglob("*.jpg"))]
        cases = {}
        for fmt, store in (("lmdb", "passthrough"), ("hdf5", "passthrough"),
                           ("wds", "passthrough"), ("lmdb", "raw")):
            name = f"{fmt}-{store}"
            v2 = convert(src, work / name, to=fmt, store=store, workers=0,
                         resize=224 if store == "raw" else None).out
            v1 = work / f"{name}-v1"
            shutil.copytree(v2, v1)
            downgrade_to_v1(v1, fmt)
            cases[name] = (v1, v2)
        mean = statistics.mean(map(len, jpegs))
        for fn in (zlib.crc32, crc32):
            t = time.perf_counter()
            for _ in range(5):
                for j in jpegs:
                    fn(j)
            dt = (time.perf_counter() - t) / (5 * len(jpegs))
            print(f"{fn.__module__}.crc32: {dt * 1e6:.1f} us per {mean / 1e3:.0f} KB JPEG "
                  f"({mean / dt / 1e9:.1f} GB/s)")
        print(f"{'dataset':18} {'reader v1':>10} {'reader v2':>10} {'ratio':>6}   "
              f"{'loader v1':>10} {'loader v2':>10} {'ratio':>6}  (samples/s, median of "
              f"{args.repeats})")
        for name, (v1, v2) in cases.items():
            runs: dict[str, list[float]] = {k: [] for k in ("r1", "r2", "l1", "l2")}
            read_all(v1), read_all(v2)  # warm the page cache
            for _ in range(args.repeats):  # interleaved: drift hits both versions alike
                runs["r1"].append(read_all(v1))
                runs["r2"].append(read_all(v2))
                runs["l1"].append(load_all(v1))
                runs["l2"].append(load_all(v2))
            m = {k: float(np.median(v)) for k, v in runs.items()}
            print(f"{name:18} {m['r1']:10.0f} {m['r2']:10.0f} {m['r2'] / m['r1']:6.3f}   "
                  f"{m['l1']:10.0f} {m['l2']:10.0f} {m['l2'] / m['l1']:6.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
