"""``feedpipe merge OUT [PART...]``: join the parts of ``convert --part i/N`` into one dataset."""

from __future__ import annotations

import argparse
from typing import Any

from .remote_args import add_storage_args, storage_options


def register(sub: Any) -> None:
    """Add the ``merge`` subcommand to the ``feedpipe`` CLI's subparsers."""
    m = sub.add_parser("merge", help="join the parts of `convert --part i/N` into one dataset",
        description=("Join the parts written by `feedpipe convert --part i/N` into one dataset, after "
                     "checking that they agree."))
    m.add_argument("out", help="the merged dataset, a folder or an object-store URL (parts "
                   "already in OUT/parts/ are always taken)")
    m.add_argument("parts", nargs="*", help="part directories or a quoted glob; moved into "
                   "OUT/parts/ (same filesystem), never copied")
    add_storage_args(m)
    m.set_defaults(func=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    from converters.merge import merge

    res = merge(args.out, args.parts, storage_options=storage_options(args))
    print(f"merged {res.parts} parts ({res.moved} moved in) into {res.out}: {res.num_samples} "
          f"samples in {res.seconds:.1f} s")
    if res.empty_classes:
        print(f"  {len(res.empty_classes)} classes have no samples in any part: "
              + ", ".join(res.empty_classes[:5]) + (" ..." if len(res.empty_classes) > 5 else ""))
    return 0
