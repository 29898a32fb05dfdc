"""Argument types shared by the subcommands: byte sizes (``2GB``) and image sizes (``HxW``)."""

from __future__ import annotations

import argparse

from ..errors import ConfigError
from ..storage.sizes import parse_size


def size_arg(text: str) -> int:
    """argparse ``type=`` for byte-size options (``256MB``, ``2GiB``: feedpipe.storage.sizes),
    checked at parse time so that argparse names the flag."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def hw_size(text: str) -> int | tuple[int, int]:
    """``--size``: ``224`` (square) or ``HxW`` (``96x128``), as make_loader's ``size=``."""
    h, x, w = text.lower().partition("x")
    try:
        size = (int(h), int(w)) if x else int(h)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use N (square) or HxW, e.g. 224 or "
                                         "96x128") from None
    if min((size, size) if isinstance(size, int) else size) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: sides must be at least 1 pixel")
    return size


def human(n: float) -> str:
    """Bytes as B/KiB/MiB/GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"
