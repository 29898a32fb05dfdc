"""The ``feedpipe`` command: the parser of every subcommand, error reporting, ``main``.
Progress bars live in the CLI, not in the library."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import traceback
import warnings
from typing import Iterator, Sequence, TextIO

import converters
import feedpipe

from .._version import __version__
from ..errors import ConfigError, FeedpipeError
from . import bench, convert, decoders, demo, doctor, index, info, merge, monitor, tune, verify
from .args import FlagParser

# One module per subcommand, in --help order: its docstring, HELP, add_arguments and run. A
# command imports what it runs (torch for bench, doctor, ...) only when it runs.
COMMANDS = (convert, merge, index, info, verify, demo, decoders, monitor, bench, doctor, tune)


def build_parser() -> FlagParser:
    """The whole CLI: every subcommand's options."""
    p = FlagParser(
        prog="feedpipe", description="Pack image and array datasets once (LMDB, HDF5, "
        "WebDataset), then feed PyTorch training at the hardware's speed; measure and tune the "
        "loader on your own data.", epilog="Run `feedpipe COMMAND --help` for a command's "
        "options; docs: README.md and docs/.")
    p.add_argument("--version", action="version", version=f"feedpipe {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of every error (and log at INFO level)")
    sub = p.add_subparsers(dest="command", required=True)

    for command in COMMANDS:
        c = sub.add_parser(command.__name__.rpartition(".")[2], help=command.HELP,
                           description=command.__doc__)
        if hasattr(command, "add_arguments"):
            command.add_arguments(c)
        c.set_defaults(func=command.run)
    p.commands = sub.choices
    return p


_PATH_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
                PermissionError)
_FULL = (errno.ENOSPC, errno.EDQUOT)


def speak_cli(message: str, option: str | None, flags: dict[str, str]) -> str:
    """A ConfigError's message in the command's terms, from the option it names: ``size=0: ...``
    becomes ``--size 0: ...``, ``size=(H, W)`` ``--size HxW``, ``x (--x)`` ``--x``."""
    flag = flags.get(option or "")
    if flag is None:
        return message
    said = f"{option}="
    message = message.replace(f"{said}(H, W)", f"{flag} HxW").replace(f" ({flag})", "")
    if message.startswith(said):
        value, sep, rest = message[len(said):].partition(":")
        if len(value) > 1 and value[0] == value[-1] == "'":
            value = value[1:-1]
        message = f"{flag} {value}{sep}{rest}"
    return message


# feedpipe's own code: the packages whose warnings are advice to print plainly
OURS = tuple(os.path.dirname(m.__file__ or "") + os.sep for m in (converters, feedpipe))


@contextlib.contextmanager
def _plain_warnings(command: str) -> Iterator[None]:
    """feedpipe's warnings print as ``feedpipe COMMAND: warning: ...``, as its errors do; other
    libraries' keep Python's form (their source line says whose they are)."""
    python_form = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        if not os.path.abspath(filename).startswith(OURS):
            return python_form(message, category, filename, lineno, file, line)
        print(f"feedpipe {command}: warning: {message}", file=file or sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose or args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        with _plain_warnings(args.command):
            code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows up here, inside the handler, not at exit
        return code
    except BrokenPipeError:  # the reader went away (`feedpipe info X | head`): stop quietly,
        devnull = os.open(os.devnull, os.O_WRONLY)  # and the final flush cannot raise again
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the closed pipe
    except KeyboardInterrupt:
        print("interrupted; nothing was left that reads as a dataset", file=sys.stderr)
        return 130
    except Exception as exc:
        # one line for feedpipe's, path and full-disk errors; anything else is a bug: traceback
        if not isinstance(exc, FeedpipeError) and not (isinstance(exc, OSError) and (
                exc.filename is not None or isinstance(exc, _PATH_ERRORS) or exc.errno in _FULL)):
            raise
        if args.debug:
            traceback.print_exc()
        message = str(exc)
        if not isinstance(exc, FeedpipeError) and getattr(exc, "errno", None) in _FULL:
            message += "; free space on that filesystem, or write elsewhere"
        if isinstance(exc, ConfigError):
            message = speak_cli(message, exc.option, parser.commands[args.command].flags)
        print(f"feedpipe {args.command}: error: {message}", file=sys.stderr)
        return 2

