"""Tools beside the data path: machine probes, bench, monitor, doctor, tune, the demo."""

from __future__ import annotations

from ..errors import ConfigError


def whole(value: object, least: int = 0) -> bool:
    """``value`` is an int (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def refuse(*rules: tuple[str, object, bool, str]) -> None:
    """The tools' one option check: a ConfigError naming the option of the first rule
    ``(option, value, valid, how to fix it)`` that is not valid."""
    for option, value, valid, how in rules:
        if not valid:
            raise ConfigError(f"{option}={value!r}: {how}", option=option)
