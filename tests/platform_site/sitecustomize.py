"""macOS and Windows as feedpipe sees them, on Linux (tests/test_platforms.py puts this folder first
on PYTHONPATH, so every process it starts, spawned workers included, runs this at start-up).

feedpipe and converters cannot import ``fcntl`` or ``resource`` (Windows has neither; other
packages still can, as they would take their own Windows path there); ``os.sched_getaffinity``
(Linux only) and ``signal.pthread_sigmask`` (not on Windows) are gone; ``spawn`` is the only start
method and the default, as on Windows (macOS's default too)."""

import builtins
import multiprocessing
import os
import signal

HIDDEN = {"fcntl", "resource"}
_import = builtins.__import__


def _hiding_import(name, globals=None, locals=None, fromlist=(), level=0):
    importer = str((globals or {}).get("__name__", ""))
    if level == 0 and name.partition(".")[0] in HIDDEN \
            and importer.partition(".")[0] in ("feedpipe", "converters"):
        raise ModuleNotFoundError(f"No module named {name!r} (hidden by {__file__})", name=name)
    return _import(name, globals, locals, fromlist, level)


builtins.__import__ = _hiding_import
del os.sched_getaffinity
del signal.pthread_sigmask
multiprocessing.get_all_start_methods = lambda: ["spawn"]
multiprocessing.set_start_method("spawn", force=True)
