"""``feedpipe demo``: generate sample photos, pack them in every format, and measure loading."""

from __future__ import annotations

import time
from pathlib import Path

from converters import convert
from converters.synth import make_photos

from ..loader.api import make_loader
from ..loader.config import Output


def run_demo(root: Path, images: int = 600) -> None:
    """Photos → LMDB/HDF5/WebDataset → one loader epoch each; prints a throughput table."""
    photos = root / "photos"
    if not photos.exists():
        print(f"generating {images} sample photos (~500x375 JPEG) in {photos}")
        make_photos(photos, images, size=(500, 375), classes=4, seed=0)
    rows = []
    for fmt in ("lmdb", "hdf5", "wds"):
        res = convert(photos, root / fmt, to=fmt, overwrite=True)
        loader = make_loader(root / fmt, 64, size=224, output=Output(dtype="uint8"),
                             device="cpu")
        n, t = 0, time.perf_counter()
        for batch in loader:
            n += len(batch["image"])
        rows.append((fmt, res.written, res.rate, res.bytes_out / max(1, res.bytes_in),
                     n / (time.perf_counter() - t), loader.config.num_workers))
    print(f"\n{'format':<8}{'samples':>9}{'convert img/s':>15}{'size vs input':>15}"
          f"{'load img/s':>12}{'workers':>9}")
    for fmt, count, crate, ratio, lrate, workers in rows:
        print(f"{fmt:<8}{count:>9}{crate:>15,.0f}{ratio:>14.3f}x{lrate:>12,.0f}{workers:>9}")
    print("\nload = one epoch of make_loader(size=224, output=Output(dtype='uint8')) incl. "
          "worker start-up; see benchmarks/ for steady-state figures")
