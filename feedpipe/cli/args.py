"""What the subcommands share: the parser, argument types (``2GB``, ``HxW``,
``--storage-option``) and the summaries' ways of listing."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn, Sequence

from ..errors import ConfigError
from ..storage.sizes import parse_size


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser that reports a usage mistake in one line, and knows each option's flag
    by its ``dest``, for errors in the command's terms."""

    commands: dict[str, FlagParser]  # subcommand -> its parser (build_parser)

    @property
    def flags(self) -> dict[str, str]:
        """``batch_size`` -> ``--batch-size``: each option's first long flag, else its first."""
        return {a.dest: max(a.option_strings, key=lambda s: s.startswith("--"))
                for a in self._actions if a.option_strings}

    def error(self, message: str) -> NoReturn:
        """A usage mistake (``--to lmbd``) in one line, not argparse's usage block; exit 2."""
        print(f"{self.prog}: error: {message}\nrun `{self.prog} --help` for the options",
              file=sys.stderr)
        raise SystemExit(2)


def size_arg(text: str) -> int:
    """argparse ``type=`` for byte sizes (``256MB``, ``2GiB``): argparse names the flag."""
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


def add_storage_args(p: argparse.ArgumentParser) -> None:
    """``--storage-option KEY=VALUE`` (repeatable): fsspec options for a URL dataset."""
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   type=_storage_pair, help="fsspec option for a URL (repeatable), e.g. "
                   "endpoint_url=http://host:9000 or client_kwargs.region_name=eu-west-1; values "
                   "are JSON when they parse (true, 3), else text")


def _storage_pair(text: str) -> tuple[list[str], Any]:
    """``KEY=VALUE``: the dotted key's names and the value (JSON when it parses, else text)."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: use KEY=VALUE")
    try:
        return key.strip().split("."), json.loads(value)
    except ValueError:
        return key.strip().split("."), value


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--storage-option`` pairs as a nested dict (a dotted key nests)."""
    out: dict[str, Any] = {}
    for (*parents, leaf), value in args.storage_option:
        node = out
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return out


def human(n: float) -> str:
    """Bytes as B/KiB/MiB/GiB."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def some(items: Sequence[str], n: int = 5, sep: str = ", ") -> str:
    """The first ``n`` items, `` ...`` when there are more."""
    return sep.join(items[:n]) + (" ..." if len(items) > n else "")


def print_first(lines: Sequence[str], n: int, more: str = "more") -> None:
    """The first ``n`` lines, then how many more the manifest lists."""
    for line in lines[:n]:
        print(line)
    if len(lines) > n:
        print(f"  ... and {len(lines) - n} {more} (all listed in the manifest)")


def given(args: argparse.Namespace, dests: Sequence[str]) -> list[str]:
    """The flags of the options ``dests`` set to other than their defaults."""
    parser: FlagParser = args.parser
    return [parser.flags[d] for d in dests if getattr(args, d) != parser.get_default(d)]
