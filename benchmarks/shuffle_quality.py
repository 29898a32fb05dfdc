"""Shuffle quality of the sharded orders: the window shuffle over k shards per rank,
the shuffle buffer, and a full permutation (what map-style data gets), on an ImageFolder-ordered
dataset (samples sorted by class, so each shard holds one or two classes: the hard case).

Reported per order, for rank 0's batch stream and the epoch's global order (all ranks):
- mixing distance: mean |new position - original position| / N over the global order (a uniform
  permutation gives 1/3) and Spearman's rank correlation between the two (0: no trace left);
- neighbour distance: mean |position(i + 1) - position(i)| / N, how far apart samples stored
  next to each other land (1/3 for a uniform permutation; small when they stay in one window);
- label runs: mean and max length of runs of equal consecutive labels in rank 0's stream;
- classes per batch: mean distinct labels in rank 0's batches;
- shards per window: the most shards rank 0 reads from at once (between a shard's first and last
  sample), which bounds the cache a remote epoch needs.

Pure computation over the plan (no I/O): the figures do not depend on the machine.

    python benchmarks/shuffle_quality.py [--samples 100000] [--classes 100] [--shard-size 500]
        [--world 8] [--batch 256] [--out benchmarks/results/shuffle_quality.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from feedpipe.loader.order import OrderSpec, interleave
from feedpipe.loader.sampler import plan_batches


def runs(labels: np.ndarray) -> np.ndarray:
    """Lengths of the runs of equal consecutive values."""
    edges = np.flatnonzero(np.diff(labels)) + 1
    return np.diff(np.concatenate([[0], edges, [len(labels)]]))


def open_shards(stream: np.ndarray, shard_size: int) -> int:
    """The most shards a stream has started and not finished at any point."""
    shard = stream // shard_size
    first = {s: i for i, s in reversed(list(enumerate(shard)))}
    last = {s: i for i, s in enumerate(shard)}
    delta = np.zeros(len(stream) + 1, int)
    for s in first:
        delta[first[s]] += 1
        delta[last[s] + 1] -= 1
    return int(np.cumsum(delta).max())


def measure(spec: OrderSpec, args: argparse.Namespace, labels: np.ndarray,
            sharded: bool = True) -> dict[str, float]:
    n, size = args.samples, args.shard_size
    shards = [range(s, min(s + size, n)) for s in range(0, n, size)]
    streams = spec.build(n, shards if sharded else None, seed=0, epoch=0)
    if spec.streams != args.world:  # map-style: the permutation dealt round-robin
        streams = [streams[0][r:: args.world] for r in range(args.world)]
    order = interleave(streams)
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    rho = np.corrcoef(np.arange(n), position)[0, 1]  # both are ranks: Pearson on ranks = Spearman
    mine = np.concatenate(plan_batches(streams, 0, args.batch, drop_last=False, uneven="pad"))
    r = runs(labels[mine])
    classes = [len(np.unique(labels[b])) for b in np.array_split(mine, len(mine) // args.batch)]
    return {"mixing_distance": float(np.abs(position - np.arange(n)).mean() / n),
            "neighbour_distance": float(np.abs(np.diff(position)).mean() / n),
            "spearman": float(rho), "label_run_mean": float(r.mean()),
            "label_run_max": int(r.max()), "classes_per_batch": float(np.mean(classes)),
            "open_shards": open_shards(mine, size)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--shard-size", type=int, default=500)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--windows", default="1,2,4,8,16,32")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/shuffle_quality.json"))
    args = ap.parse_args()
    labels = np.arange(args.samples) * args.classes // args.samples  # ImageFolder: by class
    orders = {f"window k={k}": OrderSpec(True, args.world, int(k), 0)
              for k in args.windows.split(",")}
    orders["buffer 1000 samples"] = OrderSpec(True, args.world, None, 1000)
    rows = {name: measure(spec, args, labels) for name, spec in orders.items()}
    rows["full permutation"] = measure(OrderSpec(True, 1, None, 0), args, labels, sharded=False)
    print(f"{args.samples} samples, {args.classes} classes in ImageFolder order, shards of "
          f"{args.shard_size}, {args.world} ranks, batch {args.batch}; rank 0's stream")
    print(f"{'order':22} {'mix dist':>8} {'nb dist':>8} {'spearman':>8} {'run mean':>8} {'run max':>7} "
          f"{'cls/batch':>9} {'open shards':>11}")
    for name, m in rows.items():
        print(f"{name:22} {m['mixing_distance']:8.3f} {m['neighbour_distance']:8.4f} "
              f"{m['spearman']:8.3f} "
              f"{m['label_run_mean']:8.2f} {m['label_run_max']:7d} "
              f"{m['classes_per_batch']:9.1f} {m['open_shards']:11d}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": {k: v for k, v in vars(args).items() if k != "out"},
                                    "orders": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
