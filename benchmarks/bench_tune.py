"""``num_workers="tune"`` against an exhaustive sweep, side by side in one run.

:func:`feedpipe.tools.tune.autotune` measures a few loader configurations and keeps the cheapest
within its tolerance of the fastest. Here every configuration it could pick (0 workers, and
1..``--workers`` workers × prefetch 1, 2, 4) is measured in interleaved rounds, keeping each one's
fastest round as autotune's ``repeats`` do, and autotune's pick is rated against the fastest:

    python benchmarks/bench_tune.py [--images 600] [--size 64] [--batch 16] [--rounds 3]
                                    [--data bench-data] [--json benchmarks/results/tune.json]

This was a unit test (``tests/test_tune.py``) until it flaked under load: a timing claim belongs
here, and the test now checks what autotune returns against what it measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, save  # noqa: E402

from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe.tools.tune import autotune, measure  # noqa: E402


def dataset(data: Path, n: int) -> Path:
    """An LMDB dataset of ``n`` ~500×375 photos (made once, reused)."""
    photos, out = data / f"tune-photos-{n}", data / f"tune-lmdb-{n}"
    if not photos.exists():
        make_photos(photos, n, size=(500, 375), classes=7, seed=1)
    if not out.exists():
        convert(photos, out, to="lmdb", workers=0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--size", type=int, default=64, help="output side in pixels")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="most workers (autotune's budget_cpus)")
    ap.add_argument("--trial-batches", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/tune.json"))
    args = ap.parse_args()
    path = dataset(args.data, args.images)
    opts = dict(size=args.size, device="cpu")
    res = autotune(path, args.batch, budget_cpus=args.workers, trial_batches=args.trial_batches,
                   repeats=args.rounds, cache=False, **opts)
    print(res.report())
    configs = [(0, None)] + [(w, p) for w in range(1, args.workers + 1) for p in (1, 2, 4)]
    sweep = dict.fromkeys(configs, 0.0)
    for _ in range(args.rounds):  # interleaved rounds, each configuration's fastest kept
        for w, p in configs:
            t = measure(path, args.batch, w, p, trial_batches=args.trial_batches, **opts)
            sweep[(w, p)] = max(sweep[(w, p)], t.samples_per_s or 0.0)
    best = max(sweep, key=lambda c: sweep[c])
    pick = (res.num_workers, res.prefetch_factor)
    share = sweep[pick] / sweep[best]
    print("\n| workers | prefetch | samples/s (sweep) |\n|---|---|---|")
    for (w, p), rate in sweep.items():
        mark = " (autotune's pick)" if (w, p) == pick else ""
        print(f"| {w} | {p if p is not None else '-'} | {rate:,.0f}{mark} |")
    print(f"\nautotune picked workers={pick[0]} prefetch={pick[1]}: {share:.2f} of the sweep's "
          f"fastest (workers={best[0]} prefetch={best[1]}), tolerance {0.05:.2f}")
    save(args.json, [], {"autotune": res.to_dict(), "share_of_best": share,
                         "sweep": [{"workers": w, "prefetch": p, "samples_per_s": r}
                                   for (w, p), r in sweep.items()],
                         "args": {k: str(v) for k, v in vars(args).items()},
                         "command": " ".join(sys.argv), "machine_cpu": machine()["cpu"]})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
