"""Measure num_workers and prefetch for a dataset on this machine and cache the choice, so
make_loader(..., workers=feedpipe.tuned()) starts tuned."""

from __future__ import annotations

import argparse
import json
from typing import get_args

from ..loader.config import Crop, Dtype, Output
from .args import hw_size, size_arg

HELP = ("measure num_workers/prefetch for a dataset and cache the choice "
        "(make_loader(..., workers=feedpipe.tuned()) then starts tuned)")


def add_arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("path", help="a packed dataset directory")
    t.add_argument("--batch-size", type=int, required=True)
    t.add_argument("--size", type=hw_size, help="output size: N (square) or HxW, e.g. 96x128 "
                   "(as make_loader's size=)")
    t.add_argument("--crop", default="center_crop", choices=get_args(Crop))
    t.add_argument("--dtype", default="float32", choices=get_args(Dtype))
    t.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    t.add_argument("--budget-cpus", type=int, help="most workers to try (default: usable cores)")
    t.add_argument("--budget-ram", type=size_arg,
                   help="most bytes of batches the loader may hold, e.g. 2GB or 2GiB")
    t.add_argument("--trial-batches", type=int, default=24, help="batches timed per trial")
    t.add_argument("--tolerance", type=float, default=0.05,
                   help="take the cheapest configuration within this fraction of the best")
    t.add_argument("--no-cache", action="store_true", help="measure even if a result is cached")
    t.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from ..tools.tune.autotune import autotune  # torch: only when the command runs

    size = {"size": args.size} if args.size else {}
    res = autotune(args.path, args.batch_size, budget_cpus=args.budget_cpus,
                   budget_ram=args.budget_ram, trial_batches=args.trial_batches,
                   tolerance=args.tolerance, cache=not args.no_cache, crop=args.crop,
                   output=Output(dtype=args.dtype), device=args.device, **size)
    print(json.dumps(res.to_dict(), indent=1) if args.json else res.report())
    return 0
