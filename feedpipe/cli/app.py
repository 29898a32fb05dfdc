"""The ``feedpipe`` command: the parser of every subcommand, error reporting, ``main``.
Progress bars live in the CLI, not in the library."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import sys
import traceback
from typing import Sequence

from .._version import __version__
from ..errors import ConfigError, FeedpipeError
from . import bench, convert, decoders, demo, doctor, index, info, merge, monitor, tune, verify

# One module per subcommand, in --help order. Registering is argparse only: a command imports
# what it runs (torch for bench, doctor, monitor, tune, demo) when it runs.
COMMANDS = (convert, merge, index, info, verify, demo, decoders, monitor, bench, doctor, tune)


def build_parser() -> argparse.ArgumentParser:
    """The whole CLI: every subcommand's options."""
    p = argparse.ArgumentParser(
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
        command.register(sub)
    return p


_PATH_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
                PermissionError)
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _user_error(exc: BaseException) -> bool:
    """Errors shown as one line: feedpipe's own, OS errors about a named path, and a full disk
    or quota (never a bug). Anything else is a bug and keeps its traceback."""
    return isinstance(exc, FeedpipeError) or (isinstance(exc, OSError) and (
        exc.filename is not None or isinstance(exc, _PATH_ERRORS) or exc.errno in _FULL))


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    return parser


def speak_cli(message: str, option: str | None, parser: argparse.ArgumentParser) -> str:
    """A ConfigError's message in the command's terms: ``size=0`` becomes ``--size 0`` and
    ``size=(H, W)`` becomes ``--size HxW`` for every option the command has a flag for."""
    flags = {a.dest: next((s for s in a.option_strings if s.startswith("--")),
                          a.option_strings[0]) for a in parser._actions if a.option_strings}
    for name in {option, *re.findall(r"\b([a-z_]+)=", message)} - {None}:
        flag = flags.get(name) or flags.get(name.rstrip("s"))  # batch_sizes -> --batch-size
        if flag is None:
            continue
        if flag in message:  # the message names the flag already: drop the Python spelling
            message = re.sub(rf"\b{name}=('[^']*'|\S+?)(?=[:,;]|\s)( \({flag}\))?",
                             lambda m: f"{flag} {m[1].strip(chr(39))}", message)  # noqa: B023
            continue
        message = re.sub(rf"\b{name}=\(H, W\)", f"{flag} HxW", message)
        message = re.sub(rf"\b{name}='([^']*)'", rf"{flag} \1", message)
        message = re.sub(rf"\b{name}=", f"{flag} ", message)
    return message


def _broken_pipe() -> int:
    """The reader of stdout went away (``feedpipe info X | head``): stop quietly. stdout is
    pointed at /dev/null so the interpreter's final flush cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the closed pipe


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose or args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows up here, inside the handler, not at exit
        return code
    except BrokenPipeError:
        return _broken_pipe()
    except KeyboardInterrupt:
        print("interrupted; nothing was left that reads as a dataset", file=sys.stderr)
        return 130
    except Exception as exc:
        if not _user_error(exc):
            raise  # a bug: keep the traceback
        if args.debug:
            traceback.print_exc()
        message = str(exc)
        if not isinstance(exc, FeedpipeError) and getattr(exc, "errno", None) in _FULL:
            message += "; free space on that filesystem, or write elsewhere"
        if isinstance(exc, ConfigError):
            message = speak_cli(message, exc.option, _subparser(parser, args.command))
        print(f"feedpipe {args.command}: error: {message}", file=sys.stderr)
        return 2

