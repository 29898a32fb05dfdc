"""The CLI's parser (it knows each option's flag) and the argument types the subcommands share:
byte sizes (``2GB``) and image sizes (``HxW``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from ..errors import ConfigError
from ..storage.sizes import parse_size


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser that records each option's flag by its ``dest`` (the Python option's
    name: ``batch_size`` -> ``--batch-size``), for errors in the command's terms; its
    subparsers, argument groups and mutually exclusive groups record into it too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.flags: dict[str, str] = {}  # before argparse adds --help through add_argument
        self.commands: dict[str, FlagParser] = {}  # subcommand -> its parser (build_parser)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return self._record(super().add_argument(*args, **kwargs))

    def error(self, message: str) -> NoReturn:
        """A usage mistake (``--to lmbd``, a missing ``-o``) in one line and where the options
        are, not argparse's whole usage block before it; exit status 2, as argparse's."""
        print(f"{self.prog}: error: {message}\nrun `{self.prog} --help` for the options",
              file=sys.stderr)
        raise SystemExit(2)

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        return self._recording(super().add_argument_group(*args, **kwargs))

    def add_mutually_exclusive_group(self, **kwargs: Any) -> Any:
        return self._recording(super().add_mutually_exclusive_group(**kwargs))

    def _recording(self, group: Any) -> Any:
        add = group.add_argument

        def add_argument(*args: Any, **kwargs: Any) -> argparse.Action:
            return self._record(add(*args, **kwargs))

        group.add_argument = add_argument
        return group

    def _record(self, action: argparse.Action) -> argparse.Action:
        if action.option_strings:
            longs = [s for s in action.option_strings if s.startswith("--")]
            self.flags[action.dest] = (longs or action.option_strings)[0]
        return action


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
