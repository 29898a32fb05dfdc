"""``feedpipe index DIR``: index foreign WebDataset ``.tar`` shards in place (never rewritten),
so ``make_loader(DIR)`` reads them (converters.wds_index)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .args import size_arg


def register(sub: Any) -> None:
    """Add the ``index`` subcommand to the ``feedpipe`` CLI's subparsers."""
    c = sub.add_parser("index", help="index WebDataset .tar shards written by other tools, in "
                       "place, so make_loader reads them without a conversion",
        description=("Index WebDataset .tar shards written by other tools where they are, so "
                     "make_loader reads them without a conversion."))
    c.add_argument("folder", type=Path, help="folder of .tar shards")
    c.add_argument("--overwrite", action="store_true", help="index a folder indexed before")
    c.add_argument("--max-member-size", default="256MiB", type=size_arg,
                   help="refuse a shard member larger than this (members are read whole to "
                   "checksum them; default 256MiB)")
    c.set_defaults(func=cmd_index)


def cmd_index(args: argparse.Namespace) -> int:
    from converters.wds_index import index_shards

    res = index_shards(args.folder, overwrite=args.overwrite,
                       max_member_bytes=args.max_member_size)
    print(f"indexed {res.indexed} samples in {len(res.shards)} shards of {res.root} "
          f"(fields: {', '.join(res.schema)}); the shards were not changed")
    for s in res.skipped[:20]:
        print(f"  left out of the index {s['path']}: {s['reason']}")
    if len(res.skipped) > 20:
        print(f"  ... and {len(res.skipped) - 20} more (all listed in the manifest)")
    for t in res.not_taken[:10]:
        print(f"  not taken {t['path']}: {t['reason']}")
    return 0
