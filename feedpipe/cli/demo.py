"""Generate sample photos, pack them in every format and load them back: a first check that
feedpipe works on this machine."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "pack generated sample photos in every format and load them"


def add_arguments(m: argparse.ArgumentParser) -> None:
    m.add_argument("--out", type=Path, default=Path("demo-data"))
    m.add_argument("--images", type=int, default=600)


def run(args: argparse.Namespace) -> int:
    from ..tools.demo import run_demo  # torch: only when the command runs

    run_demo(args.out, args.images)
    return 0
