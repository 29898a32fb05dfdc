"""Who may have made what the node-local cache holds, and the one way it opens its files.

A cache folder is shared by every rank and worker of a user, and on a multi-user node it may be
reachable by others. So nothing in it is opened through a symlink (a planted ``.NAME.lock`` link
would have its target truncated), nothing but a regular file is opened (a FIFO blocks forever),
and nothing an untrusted user made is read or written. Trust comes from the cache root:

- owned by this user, not writable by others (or writable by all with the sticky bit, as
  ``/tmp``): a private cache; its entries must be this user's;
- group-writable with the setgid bit (``chmod 2770``): a group-shared cache (docs/remote.md);
  entries of its group are trusted too, and feedpipe makes its own group-writable;
- anything else (owned by another user, writable by all without the sticky bit): refused.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import StorageError

_SHARE = ("a group-shared cache is a folder of that group with the setgid bit: chgrp GROUP DIR "
          "&& chmod 2770 DIR (docs/remote.md, 'Sharing a cache')")


@dataclass(frozen=True)
class Trust:
    """The owners a cache's entries may have: this user, and a shared cache's group."""

    uid: int
    gid: int | None = None  # the group of a group-shared cache; None: private

    def allows(self, st: os.stat_result) -> bool:
        return st.st_uid == self.uid or (self.gid is not None and st.st_gid == self.gid)

    def _refuse(self, path: Path, st: os.stat_result, what: str) -> None:
        if stat.S_IMODE(st.st_mode) & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise StorageError(f"{path}: the cache {what} is writable by every user (mode "
                               f"{stat.S_IMODE(st.st_mode):o}, no sticky bit): anyone could "
                               "plant links or files in it. Use a private cache_dir "
                               f"($FEEDPIPE_CACHE), or chmod o-w {path}; {_SHARE}")

    def check_folder(self, folder: Path, made: bool) -> None:
        """A dataset folder of the cache: a real folder (never a link) made by a trusted user;
        one this process ``made`` in a shared cache becomes group-writable."""
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode):
            raise StorageError(f"{folder}: in the cache, not a folder (a symlink or a file); "
                               "feedpipe never follows one there. Remove it and run again.")
        if not self.allows(st):
            raise StorageError(f"{folder}: made by user id {st.st_uid}, not by you (nor in "
                               "the cache's shared group); feedpipe does not use it. Remove "
                               "it, or use a cache_dir of your own")
        self._refuse(folder, st, "folder")
        if made and self.gid is not None:
            os.chmod(folder, stat.S_IMODE(st.st_mode) | stat.S_ISGID | 0o070)

    def open(self, path: Path, flags: int, write: bool = False) -> int:
        """``os.open`` of a cache entry: never through a symlink, only a regular file a trusted
        user made, and (``write``) never a hard link to another file. A file this process creates
        in a shared cache is made group-writable, so the group's other users can resume or
        lock it."""
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StorageError(f"{path}: a symlink in the cache; feedpipe never opens one "
                                   "there (it could lead outside). Remove it.") from exc
            raise
        try:
            st = os.fstat(fd)
            why = ("is not a regular file" if not stat.S_ISREG(st.st_mode) else
                   f"was made by user id {st.st_uid}, not by you (nor in the cache's shared "
                   "group)" if not self.allows(st) else
                   "is a hard link to another file" if write and st.st_nlink != 1 else None)
            if why is not None:
                raise StorageError(f"{path}: in the cache, {why}; feedpipe does not open it. "
                                   "Remove it, or use a cache_dir of your own.")
            if self.gid is not None and st.st_uid == self.uid and not st.st_mode & stat.S_IWGRP:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o060)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd


def trust_of(root: Path) -> Trust:
    """The trust of an existing cache root (see the module docstring); refuses an unsafe one."""
    st = os.stat(root)  # the root may be a link the user chose; what lies in it never is
    uid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    shared = bool(mode & stat.S_IWGRP and st.st_mode & stat.S_ISGID)
    trust = Trust(uid, st.st_gid if shared else None)
    trust._refuse(root, st, "folder")
    sticky_tmp = mode & stat.S_IWOTH and st.st_mode & stat.S_ISVTX
    if st.st_uid != uid and not shared and not sticky_tmp:
        raise StorageError(f"{root}: the cache folder belongs to user id {st.st_uid}, not to "
                           "you: its owner could plant links or files in it. Use a cache_dir "
                           f"of your own ($FEEDPIPE_CACHE); {_SHARE}")
    return trust
