"""The loader's rate with this checkout against another one, side by side: one dataset, the same
loader options, each checkout's epoch in a fresh process, rounds interleaved (a slow spell on a
shared machine hits both alike), medians.

Each run imports feedpipe from its checkout, builds ``make_loader(DATASET, 64, size=224,
crop=..., num_workers=W, device="cpu", output=uint8)``, runs one warm-up epoch and times the next:
samples/s (wall) and CPU µs a sample (the process and its workers, ``os.times``), the figure a
busy machine moves least. The dataset is converted once, by this checkout, from the
bench_convert.py photos (``--images`` of them, ~500×375).

    python benchmarks/bench_load_ab.py --baseline /path/to/checkout [--images 2000] [--rounds 5]
                                       [--workers 0] [--crop random_resized_crop]
                                       [--data bench-data] [--json results/load-ab.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_convert import photos  # noqa: E402
from harness import machine  # noqa: E402

_EPOCH = """
import json, os, sys, time, feedpipe
ld = feedpipe.make_loader(sys.argv[1], 64, size=224, crop=sys.argv[2], shuffle=True,
                          num_workers=int(sys.argv[3]), device="cpu",
                          output=feedpipe.Output(dtype="uint8"))
for _ in ld:
    pass
t, c = time.perf_counter(), os.times()
n = sum(len(b["image"]) for b in ld)
wall, c2 = time.perf_counter() - t, os.times()
cpu = (c2.user + c2.system + c2.children_user + c2.children_system) - (
    c.user + c.system + c.children_user + c.children_system)
print(json.dumps({"samples": n, "per_s": n / wall, "cpu_us": 1e6 * cpu / n}))
"""


def epoch(code: Path, dataset: Path, crop: str, workers: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run([sys.executable, "-c", _EPOCH, str(dataset), crop, str(workers)],
                         capture_output=True, text=True, env=env, cwd=code, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--crop", default="random_resized_crop")
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=HERE / "results" / "load-ab.json")
    args = ap.parse_args()
    from converters import convert

    dataset = args.data / f"load-ab-lmdb-{args.images}"
    if not dataset.exists():
        convert(photos(args.data, args.images, (500, 375)), dataset, to="lmdb")
    codes = {"this": HERE.parent, "baseline": args.baseline.resolve()}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in codes}
    for r in range(args.rounds):
        for label, code in (codes.items() if r % 2 == 0 else reversed(codes.items())):
            runs[label].append(epoch(code, dataset, args.crop, args.workers))
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("per_s", "cpu_us")}
           for k, v in runs.items()}
    print(f"{args.images} photos ~500x375 as LMDB, 224² {args.crop}, batch 64, "
          f"{args.workers} workers, {args.rounds} interleaved rounds (medians)")
    print("| code | samples/s | CPU µs / sample |")
    print("|---|---|---|")
    for k, m in med.items():
        print(f"| {k} | {m['per_s']:,.0f} | {m['cpu_us']:,.0f} |")
    print(f"this / baseline: {med['this']['per_s'] / med['baseline']['per_s']:.3f} (samples/s), "
          f"{med['this']['cpu_us'] / med['baseline']['cpu_us']:.3f} (CPU a sample)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": machine(), "args": {
        k: str(v) for k, v in vars(args).items()}, "runs": runs, "medians": med}, indent=1))


if __name__ == "__main__":
    main()
