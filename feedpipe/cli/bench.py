"""Measure samples/s of the loader on your data for several configurations (workers, decode,
backend) and print a table; an image folder is packed first into a temporary dataset."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..loader.config import _DTYPES as DTYPES
from ..paths import write_atomic
from .args import add_storage_args, size_arg, storage_options

HELP = "measure loader throughput on your data, per configuration"


def add_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("path", help="packed dataset, dataset URL (s3://bucket/ds/, read through "
                   "the cache), or image folder (packed first into a temporary dataset per "
                   "--formats)")
    b.add_argument("--backend", dest="backends", default="torch",
                   help="comma-separated: torch,dali")
    b.add_argument("--workers", help="comma-separated num_workers, e.g. 0,2,4,auto (default: 0 "
                   "and powers of two up to the usable cores)")
    b.add_argument("--batch-size", dest="batch_sizes", default="64",
                   help="comma-separated, e.g. 64,128")
    n = b.add_mutually_exclusive_group()
    n.add_argument("--batches", type=int, default=50, help="batches per trial (default 50)")
    n.add_argument("--epochs", type=int, help="whole epochs per trial instead of --batches")
    b.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    b.add_argument("--size", type=int, default=224, help="output HxW (center crop)")
    b.add_argument("--dtype", default="float32", choices=DTYPES)
    b.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated training step per batch; reports the share of time waiting")
    b.add_argument("--step-kind", default="sleep", choices=["sleep", "busy"],
                   help="sleep (a GPU step: CPU free) or busy (a CPU-bound step)")
    b.add_argument("--baseline", action="store_true",
                   help="also run a default and a tuned DataLoader (PIL) on the loose images")
    b.add_argument("--formats", default="lmdb", help="folder input: formats to pack and compare")
    b.add_argument("--limit", type=int, help="folder input: pack only N images (evenly spaced)")
    b.add_argument("--pack-dir", type=Path, help="folder input: keep the packed data here")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--threads", type=int, help="torch threads of the training process during "
                   "the run (default: torch's own setting, recorded in --json)")
    b.add_argument("--json", type=Path, help="write every figure + the machine to this file")
    b.add_argument("--plot", type=Path, help="write a PNG: samples/s vs workers (matplotlib)")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_storage_args(b)
    b.add_argument("--cache-dir", help="a URL's node-local cache, shared with training jobs "
                   "(default: $FEEDPIPE_CACHE or ~/.cache/feedpipe/remote)")
    b.add_argument("--cache-limit", type=size_arg, help="that cache's bound: bytes or a size "
                   "like 200GB or 1.5GiB (default: unbounded)")


def _list(text: str, kind: type, what: str) -> tuple[Any, ...]:
    """'0,2,auto' -> (0, 2, 'auto'); a bad item names the option and what to write instead."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        try:
            out.append(item if item == "auto" and what == "--workers" else kind(item))
        except ValueError:
            example = "0,2,auto" if what == "--workers" else "64,128"
            raise ConfigError(f"{what} {text!r}: {item!r} is not a valid value; use a "
                              f"comma-separated list such as {example}") from None
    return tuple(out)


def run(args: argparse.Namespace) -> int:
    """Run the sweep with a progress bar (stderr); print the table; write --json / --plot."""
    from tqdm import tqdm

    from ..tools.bench import BenchConfig, run_bench  # torch: only when the command runs
    from ..tools.benchreport import check_output_path, figure_class, format_table, plot_report

    for option, out in (("--json", args.json), ("--plot", args.plot)):
        if out is not None:  # before the run, not after minutes of it
            check_output_path(out, option)
    if args.plot:
        figure_class()
    cfg = BenchConfig(
        backends=tuple(args.backends.split(",")),  # type: ignore[arg-type]
        batch_sizes=_list(args.batch_sizes, int, "--batch-size"),
        workers=_list(args.workers, int, "--workers") if args.workers else None,
        batches=None if args.epochs else args.batches, epochs=args.epochs, device=args.device,
        size=args.size, dtype=args.dtype, step_ms=args.step_ms, step_kind=args.step_kind,
        baseline=args.baseline, formats=tuple(args.formats.split(",")), limit=args.limit,
        pack_dir=args.pack_dir, seed=args.seed, threads=args.threads)
    bars: dict[str, Any] = {}

    def progress(stage: str, done: int, total: int | None) -> None:
        if stage not in bars:
            for b in bars.values():
                b.close()
            bars.clear()
            bars[stage] = tqdm(total=total, desc=stage, unit="batch" if "pack" not in stage
                               else "img", leave=False, disable=args.quiet or None, file=sys.stderr)
        bar = bars[stage]
        bar.total = total
        bar.update(done - bar.n)

    try:
        report = run_bench(args.path, cfg, progress, cache_dir=args.cache_dir,
                           cache_limit=args.cache_limit, storage_options=storage_options(args))
    finally:
        for b in bars.values():
            b.close()
    for fmt, p in report.dataset.get("packed", {}).items():
        where = f"kept in {p['path']}" if p["kept"] else "temporary, removed; --pack-dir keeps it"
        print(f"packed {p['images']} images of {args.path} into {fmt} in {p['seconds']:.1f} s "
              f"({where}); the trials read that")
        if p["skipped"]:
            first = p["skipped"][0]
            print(f"  skipped {len(p['skipped'])} unreadable input(s), not benchmarked; first: "
                  f"{first['path']}: {first['reason']}")
    print(format_table(report))
    if args.json:
        write_atomic(args.json, json.dumps(report.to_json(), indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {plot_report(report, args.plot)}")
    return 0
