"""``feedpipe decoders``: which image decoders are active (simplejpeg, Pillow or pillow-simd)."""

from __future__ import annotations

import json
from typing import Any

from ..schema.imaging import decoder_info


def register(sub: Any) -> None:
    """Add the ``decoders`` subcommand to the ``feedpipe`` CLI's subparsers."""
    d = sub.add_parser("decoders", help="print which image decoders are active",
        description="Print which image decoders this install uses (simplejpeg, Pillow, nvJPEG/DALI) as JSON.")
    d.set_defaults(func=lambda a: print(json.dumps(decoder_info(), indent=1)) or 0)
