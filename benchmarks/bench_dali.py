"""DALI backend versus torch backend on the same data, side by side.

~500×375 photos packed as LMDB and WebDataset (original JPEG bytes) and as raw 224×224 LMDB; one
epoch per run, batch 64, configurations timed in interleaved rounds (median of ``--repeats``).
Besides images/s, each run's CPU time (main process, its threads and its worker processes) gives
images per CPU-second, the figure that matters when decode moves to a GPU. Without a GPU DALI
runs in CPU mode (libjpeg-turbo decode and DALI's CPU resize in DALI's threads).

    python benchmarks/bench_dali.py [--images 1000] [--data bench-data] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import psutil
import torch

from feedpipe import Dali, Output

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Items, Result, drain, measure_side_by_side, save  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe.loader.config import usable_cores  # noqa: E402

BATCH = 64


def cpu_seconds() -> float:
    """CPU time of this process (DALI's threads included) and of its live child processes."""
    procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def timed(loader: Any, cpu: list[float]) -> Callable[[], Items]:
    """One epoch of ``loader``; appends the CPU seconds it took to ``cpu``."""
    def run() -> Items:
        c = cpu_seconds()
        n = drain(loader)
        cpu.append(cpu_seconds() - c)
        return n
    return run


def group(title: str, loaders: dict[str, Any], repeats: int) -> list[Result]:
    """Time ``loaders`` side by side; notes carry images per CPU-second."""
    print(title)
    cpu: dict[str, list[float]] = {name: [] for name in loaders}
    results = measure_side_by_side({n: timed(ld, cpu[n]) for n, ld in loaders.items()},
                                   repeats=repeats)
    for r in results:
        per_cpu = r.items / sorted(cpu[r.name])[len(cpu[r.name]) // 2]
        r.note = f"{per_cpu:,.0f} images per CPU-second"
        print(f"    {r.name:<42} {r.note}")
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/dali.json"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the same main-process setting for every configuration
    photos = args.data / f"photos-{args.images}"
    if not photos.exists():
        print(f"generating {args.images} photos (~500x375) in {photos}")
        make_photos(photos, args.images, size=(500, 375), classes=7, seed=1)
    packed = {}
    for fmt, store in (("lmdb", "passthrough"), ("wds", "passthrough"), ("lmdb", "raw")):
        out = args.data / f"{fmt}-{store}-{args.images}"
        if not out.exists():
            convert(photos, out, to=fmt, store=store,
                    resize=args.size if store == "raw" else None,
                    writer_options={"shard_size": 32 << 20} if fmt == "wds" else None)
        packed[f"{fmt}-{store}"] = out
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{usable_cores()} usable cores, device {device}; batch {BATCH}, {args.size}² output")

    def pair(path: Path, **kw: Any) -> dict[str, Any]:
        kw = dict(size=args.size, device=device, **kw)
        return {"torch": feedpipe.make_loader(path, BATCH, backend="torch", **kw),
                "dali": feedpipe.make_loader(path, BATCH, backend="dali", **kw)}

    results: list[Result] = []
    t0 = time.perf_counter()
    for title, path, kw in (
            ("LMDB JPEG, center crop, uint8", packed["lmdb-passthrough"],
             dict(output=Output(dtype="uint8"))),
            ("LMDB JPEG, random-resized-crop + flip, float16 normalized",
             packed["lmdb-passthrough"],
             dict(crop="random_resized_crop", flip=True, output=Output(dtype="float16"))),
            ("raw LMDB (no decode), center crop, uint8", packed["lmdb-raw"],
             dict(output=Output(dtype="uint8")))):
        loaders = pair(path, **kw)
        results += [replace(r, name=f"{title}: {r.name}")
                    for r in group(title, loaders, args.repeats)]
    wds = packed["wds-passthrough"]
    loaders = {**pair(wds, output=Output(dtype="uint8")),
               "dali webdataset reader": feedpipe.make_loader(
                   wds, BATCH, backend=Dali(reader="webdataset"), size=args.size,
                   device=device, output=Output(dtype="uint8"))}
    title = "WebDataset JPEG, center crop, uint8"
    results += [replace(r, name=f"{title}: {r.name}")
                for r in group(title, loaders, args.repeats)]
    print(f"({time.perf_counter() - t0:.0f} s)")
    save(args.json, results, {"images": args.images, "batch": BATCH, "size": args.size,
                              "device": device})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
