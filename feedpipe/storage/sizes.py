"""Byte sizes as text, one convention for every size option (``--shard-size``,
``--max-member-size``, ``--budget-ram``, ``--cache-limit``, ``cache_limit=``): the SI and IEC
units, as ``du --si``, pip and the IEC standard read them. ``kB``/``MB``/``GB``/``TB`` (or
``k``/``M``/``G``/``T``) are powers of 1000, ``KiB``/``MiB``/``GiB``/``TiB`` powers of 1024; a bare
number is bytes. Case does not matter (``256mb`` is ``256MB``)."""

from __future__ import annotations

import re

from ..errors import ConfigError

UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
         "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
         "tib": 2**40}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*")
HOW = ("use a positive number of bytes, optionally with a unit: kB, MB, GB, TB (powers of 1000) "
       "or KiB, MiB, GiB, TiB (powers of 1024), e.g. 256MB or 1.5GiB")


def parse_size(value: str | int, option: str | None = None) -> int:
    """Bytes from ``"200GB"``, ``"1.5GiB"``, ``"500M"``, ``"4096"`` or an int; anything else,
    or a size under one byte, is a ConfigError naming ``option`` (the Python name)."""
    n = 0
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)) and m[2].lower() in UNITS:
        n = int(float(m[1]) * UNITS[m[2].lower()])
    if n <= 0:
        said = f"{option}={value!r}" if option else f"{value!r} is not a size"
        raise ConfigError(f"{said}: {HOW}", option=option)
    return n
