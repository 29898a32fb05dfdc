"""``--storage-option KEY=VALUE``: fsspec storage options for URL datasets, shared by the
subcommands that take one (credentials and endpoints otherwise come from the environment); and
``--cache-dir`` / ``--cache-limit``, the node-local cache of the subcommands that read a URL
through it, as make_loader's ``cache_dir=`` / ``cache_limit=``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .args import size_arg


def add_storage_args(p: argparse.ArgumentParser) -> None:
    """Add ``--storage-option`` (repeatable) to a subcommand."""
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="fsspec option for a URL (repeatable), e.g. endpoint_url=http://host:9000 "
                   "or client_kwargs.region_name=eu-west-1; values are JSON when they parse "
                   "(true, 3), else text")


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """Add ``--cache-dir`` and ``--cache-limit`` (make_loader's cache_dir= and cache_limit=)."""
    p.add_argument("--cache-dir", help="a URL's node-local cache, shared with training jobs "
                   "(default: $FEEDPIPE_CACHE or ~/.cache/feedpipe/remote)")
    p.add_argument("--cache-limit", type=size_arg, help="that cache's bound: bytes or a size "
                   "like 200GB or 1.5GiB (default: unbounded)")


def cache_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--cache-dir`` / ``--cache-limit`` (bytes) as open_dataset's keywords."""
    return {"cache_dir": args.cache_dir, "cache_limit": args.cache_limit}


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--storage-option`` pairs as a nested dict (a dotted key nests)."""
    out: dict[str, Any] = {}
    for pair in getattr(args, "storage_option", None) or []:
        key, eq, text = pair.partition("=")
        if not eq or not key.strip():
            raise argparse.ArgumentTypeError(f"--storage-option {pair!r}: use KEY=VALUE")
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        *parents, leaf = key.strip().split(".")
        node = out
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return out
