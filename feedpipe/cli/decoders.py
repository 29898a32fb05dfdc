"""Print which image decoders this install uses (simplejpeg, Pillow, nvJPEG/DALI) as JSON."""

from __future__ import annotations

import argparse
import json

from ..schema.imaging import decoder_info

HELP = "print which image decoders are active"


def run(args: argparse.Namespace) -> int:
    print(json.dumps(decoder_info(), indent=1))
    return 0
