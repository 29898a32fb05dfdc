"""The accepted values of each conversion option, as ``Literal`` types: the one place they are
spelled, for :func:`converters.convert`'s signature, its checks and the CLI's ``choices``.
Light to import (no numpy, no Pillow), so ``feedpipe info`` builds its parser fast."""

from __future__ import annotations

from typing import Literal

Format = Literal["lmdb", "hdf5", "wds"]
Store = Literal["passthrough", "reencode", "raw"]
Codec = Literal["auto", "jpeg", "png", "webp"]
Check = Literal["header", "decode"]
ExtraChannels = Literal["refuse", "drop"]
MaskStore = Literal["png", "raw"]
MaskDtype = Literal["uint8", "uint16"]
Layout = Literal["auto", "imagefolder", "flat"]
TargetDtype = Literal["float16", "float32", "uint8", "uint16"]

RESIZE_HELP = ("an int (the shorter side, e.g. 256) or (height, width) like make_loader's size=, "
               "e.g. (240, 320) for 320 wide and 240 high")
