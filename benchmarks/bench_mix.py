"""Mixing datasets (docs/mixing.md): what a mix costs against one dataset of the same samples,
side by side in one run, and how long an epoch's plan takes at scale.

1. Loader epochs/s (torch backend, main process, uint8 224² centre crop): one LMDB dataset of
   2N photos against a mix of two N-photo datasets (LMDB + WebDataset), weights 0.5/0.5.
2. ``MixOrder.build`` for two map-style sources of ``--plan-sizes`` samples (one planned epoch).

    python benchmarks/bench_mix.py [--images 600] [--rounds 5] [--plan-sizes 4000000 1000000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from feedpipe import Mix, Output

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import drain, measure_side_by_side, save  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.synth import make_photos  # noqa: E402
from feedpipe.loader.mixing import epoch_counts, source_take  # noqa: E402
from feedpipe.loader.sampler import rng_for  # noqa: E402


def plan_seconds(sizes: list[int]) -> float:
    """Seconds to plan one shuffled epoch of a two-source mix (the per-source picks and the
    interleave, as :class:`MixOrder` does, without opening datasets)."""
    import numpy as np

    t = time.perf_counter()
    counts = epoch_counts(sizes, (0.7, 0.3), None)
    takes = [source_take(n, c, s, seed=0, epoch=3, shuffle=True)
             for s, (n, c) in enumerate(zip(sizes, counts, strict=True))]
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(2), counts))
    order = np.empty(len(labels), np.int64)
    for s, take in enumerate(takes):
        order[labels == s] = take
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=600, help="photos per mixed dataset")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--plan-sizes", type=int, nargs=2, default=[4_000_000, 1_000_000])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mix.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a = make_photos(root / "a", args.images, size=(320, 240), seed=0)
        b = make_photos(root / "b", args.images, size=(320, 240), seed=1)
        both = root / "both"
        for src in (a, b):  # one tree with the two sets' files, for the single dataset
            for p in src.rglob("*.jpg"):
                dst = both / p.parent.name / f"{src.name}-{p.name}"
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(p.read_bytes())
        convert(a, root / "a.lmdb", to="lmdb", workers=0)
        convert(b, root / "b.wds", to="wds", workers=0, writer_options={"shard_count": 100})
        convert(both, root / "one.lmdb", to="lmdb", workers=0)
        kw = dict(size=224, device="cpu", num_workers=0, seed=1, output=Output(dtype="uint8"))
        runs = {
            f"one LMDB dataset, {2 * args.images}": lambda: drain(
                feedpipe.make_loader(root / "one.lmdb", 64, **kw)),
            f"mix LMDB + WDS, 2 x {args.images}, 0.5/0.5": lambda: drain(
                feedpipe.make_loader(Mix([root / "a.lmdb", root / "b.wds"], weights=[0.5, 0.5]),
                                     64, fields=["image", "label", "source"], **kw)),
        }
        results = measure_side_by_side(runs, repeats=args.rounds)
    plan, single = [], []
    for _ in range(3):  # interleaved: a mix's plan, and one dataset's (one permutation)
        plan.append(plan_seconds(args.plan_sizes))
        t = time.perf_counter()
        rng_for(0, 3).permutation(sum(args.plan_sizes))
        single.append(time.perf_counter() - t)
    print(f"  plan of one epoch, sources {args.plan_sizes}: {min(plan):.2f} s (best of 3); one "
          f"dataset of the same size: {min(single):.2f} s")
    save(args.out, results, {"images_per_dataset": args.images, "plan_sizes": args.plan_sizes,
                             "plan_seconds": plan, "single_dataset_plan_seconds": single,
                             "ratio_mix_over_one": results[1].rate / results[0].rate})


if __name__ == "__main__":
    main()
