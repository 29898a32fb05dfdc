"""Join the parts written by `feedpipe convert --part i/N` into one dataset, after checking that
they agree."""

from __future__ import annotations

import argparse

from .args import add_storage_args, some, storage_options

HELP = "join the parts of `convert --part i/N` into one dataset"


def add_arguments(m: argparse.ArgumentParser) -> None:
    m.add_argument("out", help="the merged dataset, a folder or an object-store URL (parts "
                   "already in OUT/parts/ are always taken)")
    m.add_argument("parts", nargs="*", help="part directories or a quoted glob; moved into "
                   "OUT/parts/ (same filesystem), never copied")
    add_storage_args(m)


def run(args: argparse.Namespace) -> int:
    from converters.merge import merge

    res = merge(args.out, args.parts, storage_options=storage_options(args))
    print(f"merged {res.parts} parts ({res.moved} moved in) into {res.out}: {res.num_samples} "
          f"samples in {res.seconds:.1f} s")
    if res.empty_classes:
        print(f"  {len(res.empty_classes)} classes have no samples in any part: "
              + some(res.empty_classes))
    return 0
