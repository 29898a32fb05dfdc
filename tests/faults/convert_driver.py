"""Run one conversion that SIGKILLs itself at a chosen phase (the fault suite's precise kill -9).

Usage: python convert_driver.py PHASE SRC OUT FORMAT [--overwrite] [--workers N]

PHASE: scan (after scanning, before any output), write (after some samples reached the writer,
with worker processes running), manifest (the manifest's temp file written, not renamed),
swap (the finished output complete, not yet swapped into place), swapped (swapped in, the old
dataset not yet removed), none (no kill), pause (no kill: wait mid-write, holding the output,
until the file named by $PAUSE_FILE exists). The process kills itself with
os.kill(getpid(), SIGKILL):
no handler, no cleanup, exactly as a kill -9 or the OOM killer would.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from functools import wraps
from pathlib import Path
from typing import Any, Callable

import converters.pack
import converters.swap
from converters import convert
from feedpipe.dataset.manifest import MANIFEST_NAME
from feedpipe.dataset.registry import WRITERS


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def after(fn: Callable[..., Any], when: Callable[..., bool] = lambda *a, **k: True
          ) -> Callable[..., Any]:
    """``fn``, then SIGKILL when ``when(*args)`` holds."""
    @wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if when(*args, **kwargs):
            die()
        return out
    return wrapped


def before(fn: Callable[..., Any], when: Callable[..., bool] = lambda *a, **k: True
           ) -> Callable[..., Any]:
    """SIGKILL when ``when(*args)`` holds, else ``fn``."""
    @wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if when(*args, **kwargs):
            die()
        return fn(*args, **kwargs)
    return wrapped


def arm(phase: str, fmt: str) -> None:
    if phase == "scan":
        converters.pack.scan = after(converters.pack.scan)
    elif phase == "write":  # the 40th sample: workers are busy with the rest
        cls = WRITERS[fmt]
        cls._write = after(cls._write, lambda self, index, values: index == 40)
    elif phase == "manifest":  # Manifest.write: temp file written and fsynced, not yet renamed
        os.replace = before(os.replace, lambda src, dst, **k: Path(dst).name == MANIFEST_NAME)
    elif phase in ("swap", "swapped"):
        partial = lambda a, *rest, **k: str(a).endswith(".partial")  # noqa: E731
        wrap = before if phase == "swap" else after
        converters.swap.exchange = wrap(converters.swap.exchange, partial)
        os.rename = wrap(os.rename, partial)  # the first conversion into a new path renames
    elif phase == "pause":  # hold the output (and its lock) mid-write until PAUSE_FILE exists
        cls = WRITERS[fmt]

        def hold(self: Any, index: int, values: Any) -> bool:
            while index == 40 and not Path(os.environ["PAUSE_FILE"]).exists():
                time.sleep(0.01)
            return False
        cls._write = before(cls._write, hold)
    elif phase != "none":
        raise SystemExit(f"unknown phase {phase}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("phase")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("fmt")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    arm(a.phase, a.fmt)
    opts = {"shard_count": 16} if a.fmt == "wds" else {}
    res = convert(a.src, a.out, to=a.fmt, workers=a.workers, store="reencode",
                  overwrite=a.overwrite, writer_options=opts)
    print(res.written)


if __name__ == "__main__":
    main()
