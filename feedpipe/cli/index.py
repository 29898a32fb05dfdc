"""Index WebDataset .tar shards written by other tools where they are, so make_loader reads them
without a conversion."""

from __future__ import annotations

import argparse
from pathlib import Path

from .args import print_first, size_arg

HELP = ("index WebDataset .tar shards written by other tools, in place, so make_loader reads "
        "them without a conversion")


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("folder", type=Path, help="folder of .tar shards")
    c.add_argument("--overwrite", action="store_true", help="index a folder indexed before")
    c.add_argument("--max-member-size", default="256MiB", type=size_arg,
                   help="refuse a shard member larger than this (members are read whole to "
                   "checksum them; default 256MiB)")


def run(args: argparse.Namespace) -> int:
    from converters.wds_index import index_shards

    res = index_shards(args.folder, overwrite=args.overwrite,
                       max_member_bytes=args.max_member_size)
    print(f"indexed {res.indexed} samples in {len(res.shards)} shards of {res.root} "
          f"(fields: {', '.join(res.schema)}); the shards were not changed")
    print_first([f"  left out of the index {s['path']}: {s['reason']}" for s in res.skipped], 20)
    for t in res.not_taken[:10]:
        print(f"  not taken {t['path']}: {t['reason']}")
    return 0
