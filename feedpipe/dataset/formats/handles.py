"""Descriptors a reader holds in one process: bounded, closed with the reader, never inherited.

:class:`OpenFiles` keeps at most ``limit`` open (least recently used closed first: thousands of
shards never meet the open-file limit), closes them with its reader, and closes a forked child's
copies at the fork. :func:`open_error` tells an OSError about the file (damage, named by the
caller) from one about the process or system: a :class:`~feedpipe.errors.ResourceError`.
"""

from __future__ import annotations

import errno
import os
import weakref
from collections import OrderedDict

from ...errors import FeedpipeError, ResourceError

#: shard files a reader keeps open per process (``max_open_shards=``); 64 keep the cost of
#: reopening to one open() per 64 shard switches, well inside the usual limit of 1,024
MAX_OPEN = 64
#: errors that describe the file itself: missing, not a file, unreadable, a bad disk block
DATA_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.EIO,
                         errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.ENXIO})
_LIVE: weakref.WeakSet[OpenFiles] = weakref.WeakSet()


def open_error(exc: OSError, path: object) -> OSError:
    """``exc`` as it should be raised: itself when it is about the file or already typed, else
    a ResourceError naming ``path`` and what to change."""
    if exc.errno in DATA_ERRNOS or isinstance(exc, FeedpipeError):
        return exc
    hint = ("raise the open-file limit (ulimit -n) or lower max_open_shards="
            if exc.errno in (errno.EMFILE, errno.ENFILE) else
            "free memory or lower num_workers" if exc.errno == errno.ENOMEM else
            "check the file system it is on")
    out = ResourceError(f"{path}: cannot open it: {exc.strerror or exc}. This is not damage to "
                        f"the dataset, so it is not skipped: {hint}, then run again",
                        file=str(path))
    out.errno, out.strerror = exc.errno, exc.strerror
    return out


class OpenFiles:
    """The descriptors one reader holds open in this process, by key (a shard number): at most
    ``limit``, the least recently used closed first; all closed by :meth:`close`, or when
    ``owner`` is garbage collected."""

    def __init__(self, owner: object, limit: int = MAX_OPEN) -> None:
        self.limit, self.pid = max(1, limit), os.getpid()
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._final = weakref.finalize(owner, self.clear)
        self._final.atexit = False  # the process's exit closes them anyway
        _LIVE.add(self)

    def get(self, key: int) -> int | None:
        """The open descriptor of ``key`` (now the most recently used), None when closed."""
        fd = self._fds.get(key)
        if fd is not None:
            self._fds.move_to_end(key)
        return fd

    def add(self, key: int, fd: int) -> None:
        """Keep ``fd`` as ``key``'s, closing the least recently used beyond the limit."""
        self._fds[key] = fd
        while len(self._fds) > self.limit:
            os.close(self._fds.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self._fds)

    def clear(self) -> None:
        """Close every descriptor (opened again on the next :meth:`add`)."""
        fds, self._fds = self._fds, OrderedDict()
        if self.pid == os.getpid():  # another process's numbers are not ours to close
            for fd in fds.values():
                os.close(fd)

    def close(self) -> None:
        """Close every descriptor, for good (the owner's finalizer is spent)."""
        self._final()
        self._fds.clear()


def _after_fork() -> None:
    """A forked child closes its copies of its parent's descriptors (the parent keeps its own,
    and the shared locks a remote reader holds on them)."""
    for files in list(_LIVE):
        files.pid = os.getpid()
        files.clear()


os.register_at_fork(after_in_child=_after_fork)
