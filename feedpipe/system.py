"""What differs between the systems feedpipe runs on (Linux; macOS lacks ``sched_getaffinity``,
Windows also ``resource`` and signal masks: tests/test_platforms.py). The lowest layer: it
imports nothing of feedpipe, nor torch."""

from __future__ import annotations

import os
import signal

try:
    import resource
except ImportError:  # Windows: no file size limit to honour
    resource = None  # type: ignore[assignment]


def usable_cores() -> int:
    """Cores this process may run on (affinity, cgroup cpusets), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def file_size_limit() -> int | None:
    """The largest file this process may write (``ulimit -f``), None when unlimited or unknown."""
    if resource is None:
        return None
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def try_lock(fd: int) -> bool:
    """Lock an open file exclusively, at once or not at all (False: another process holds it),
    with filelock's portable primitive; the system drops it when the holder closes or dies."""
    import filelock  # here: readers and conversion workers never lock, nor pay for its import

    return filelock.lock_descriptor(fd, blocking=False)


def block_sigint() -> set[int | signal.Signals] | None:
    """Hold Ctrl-C back until :func:`restore_sigmask`; the mask to restore, None where the
    system has no signal masks (Windows: nothing is held back)."""
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def restore_sigmask(mask: set[int | signal.Signals] | None) -> None:
    """Undo :func:`block_sigint` (a Ctrl-C that came meanwhile is raised now)."""
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
