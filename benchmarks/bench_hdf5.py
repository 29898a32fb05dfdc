"""HDF5 reads and conversion, this checkout against another (``--baseline``), on the same photos:
each checkout converts them with its own CLI (so its own HDF5 layout), then the rounds alternate
which checkout goes first, every figure from a fresh process of that checkout:

- conversion: ``feedpipe convert SRC --to hdf5 -o OUT -q``, process start to exit, images/s;
- random reads: ``reader.visit`` of random 64-sample batches (every field; ``visit-image``: the
  image and label only), µs a sample;
- loader: one ``make_loader`` epoch after a warm-up one (224² centre crop, uint8, batch 64), 0
  and 2 workers, images/s; ``cpu-0``: the in-process epoch's images per CPU second of the
  process (less moved by other work on a shared machine than the wall rates).

    python benchmarks/bench_hdf5.py --baseline /path/to/checkout [--images 3000] [--rounds 5]
                                    [--kinds convert visit ...] [--data bench-data]
                                    [--json benchmarks/results/hdf5.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
KINDS = ("convert", "visit", "visit-image", "loader-0", "loader-2", "cpu-0")


def child(kind: str, path: str) -> float:
    """One figure of ``kind`` on the dataset ``path``, in this process (the checkout's feedpipe)."""
    import numpy as np

    import feedpipe
    from feedpipe import Output

    if kind.startswith("visit"):
        ds = feedpipe.open_dataset(path)
        fields = ("image", "label") if kind == "visit-image" else None
        rng = np.random.default_rng(0)
        batches = [rng.choice(len(ds), 64, replace=False) for _ in range(400)]
        for b in batches[:20]:  # warm-up: open, page cache
            ds.visit(b, lambda *_: None, fields)
        t = time.perf_counter()
        for b in batches:
            ds.visit(b, lambda *_: None, fields)
        return 1e6 * (time.perf_counter() - t) / (64 * len(batches))
    ld = feedpipe.make_loader(path, 64, size=224, crop="center_crop", device="cpu",
                              num_workers=int(kind.split("-")[1]),
                              output=Output(dtype="uint8", mean=None, std=None))
    sum(len(b["label"]) for b in ld)  # warm-up epoch
    clock = time.process_time if kind == "cpu-0" else time.perf_counter
    t = clock()
    n = sum(len(b["label"]) for b in ld)
    return n / (clock() - t)


def run(code: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(code)}
    return subprocess.run([sys.executable, *args], check=True, capture_output=True, text=True,
                          env=env, cwd=code).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", type=Path, required=True, help="the other checkout")
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/hdf5.json"))
    a = ap.parse_args()
    codes = {"this": HERE.parents[1], "baseline": a.baseline.resolve()}
    photos = (a.data / f"photos-{a.images}").resolve()
    if not photos.exists():
        run(codes["this"], "-c", "import sys; from converters.synth import make_photos; "
            "make_photos(sys.argv[1], int(sys.argv[2]), size=(500, 375), classes=7, seed=1)",
            str(photos), str(a.images))
    out = {name: (a.data / f"hdf5-ab-{name}-{a.images}").resolve() for name in codes}
    got: dict[str, dict[str, list[float]]] = {name: {k: [] for k in a.kinds} for name in codes}
    for r in range(a.rounds):
        for name in codes if r % 2 == 0 else list(codes)[::-1]:
            if r == 0 or "convert" in a.kinds:
                shutil.rmtree(out[name], ignore_errors=True)
                t = time.perf_counter()
                run(codes[name], "-m", "feedpipe.cli", "convert", str(photos), "--to", "hdf5",
                    "-o", str(out[name]), "--store", "passthrough", "-q")
                if "convert" in a.kinds:
                    got[name]["convert"].append(a.images / (time.perf_counter() - t))
            for kind in (k for k in a.kinds if k != "convert"):
                got[name][kind].append(float(run(codes[name], str(HERE), "--child", kind,
                                                 str(out[name])).strip()))
        print(json.dumps({n: {k: round(v[-1], 2) for k, v in g.items()} for n, g in got.items()}),
              flush=True)
    med = {n: {k: round(statistics.median(v), 2) for k, v in g.items()} for n, g in got.items()}
    res = {"median": med, "this_over_baseline": {
        k: round(med["this"][k] / med["baseline"][k], 3) for k in a.kinds},
        "rounds": got, "images": a.images, "baseline": str(codes["baseline"]),
        "note": "visit: µs a sample (lower is better); cpu-0: images per CPU second; the "
                "rest: images/s"}
    print(json.dumps({k: res[k] for k in ("median", "this_over_baseline")}, indent=1))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(child(sys.argv[2], sys.argv[3]))
    else:
        main()
