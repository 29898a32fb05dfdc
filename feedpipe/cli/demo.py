"""``feedpipe demo``: pack generated sample photos in every format and load them."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand to the ``feedpipe`` CLI's subparsers."""
    m = sub.add_parser("demo", help="pack generated sample photos in every format and load them",
        description=("Generate sample photos, pack them in every format and load them back: a first "
                     "check that feedpipe works on this machine."))
    m.add_argument("--out", type=Path, default=Path("demo-data"))
    m.add_argument("--images", type=int, default=600)
    m.set_defaults(func=lambda a: cmd_demo(a.out, a.images))


def cmd_demo(out: Path, images: int) -> int:
    from ..tools.demo import run_demo  # torch: only when the command runs

    run_demo(out, images)
    return 0
