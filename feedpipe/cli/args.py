"""Argument types shared by the subcommands: byte sizes (``2G``) and image sizes (``HxW``)."""

from __future__ import annotations

import argparse

from ..errors import ConfigError


def parse_size(text: str) -> int:
    """``256MB``, ``2G``, ``4096`` → bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("b")
    mult = units.get(t[-1:], 1)
    try:
        n = int(float(t[:-1] if t[-1:] in units else t) * mult)
    except (ValueError, OverflowError):
        n = 0
    if n <= 0:
        raise ConfigError(f"{text!r} is not a size: use a positive byte count with an optional "
                          "k/m/g suffix, e.g. 256MB or 2G")
    return n


def size_arg(text: str) -> str:
    """argparse ``type=`` for size options: checked at parse time (the flag is named), kept as
    text for the command."""
    try:
        parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


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
