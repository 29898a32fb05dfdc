"""The ``feedpipe`` command: ``main`` parses the arguments and runs one subcommand."""

from .app import build_parser, main

__all__ = ["build_parser", "main"]
