"""The node-local cache on a multi-user node: links, hard links and foreign
files planted under the names the cache writes are refused by name, their targets untouched; a
cache folder others may write to (or another user owns) is refused, a group-shared one (setgid)
works. Real downloads from the HTTP server of tests/servers.py on 127.0.0.1."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import feedpipe
from feedpipe.dataset.manifest import MANIFEST_NAME
from feedpipe.errors import StorageError
from feedpipe.storage import join, read_bytes
from feedpipe.storage.cache import Cache

pytest.importorskip("fsspec")
VICTIM = b"precious: not feedpipe's\n"
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _folder(cache: Path, url: str) -> Path:
    """The cache folder ``open_dataset(url, cache_dir=cache)`` uses (made now, as it would)."""
    return Cache(cache).dataset_dir(url, read_bytes(join(url, MANIFEST_NAME)))


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    return victim


@pytest.mark.parametrize("name", [".data.mdb.lock", ".data.mdb.part"])
@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_planted_links_in_the_cache_are_refused(http_packed, tmp_path, name, how):
    """The download lock is truncated and written, the part file appended to."""
    server, urls = http_packed
    server.faults([])
    victim = _victim(tmp_path)
    folder = _folder(tmp_path / "cache", urls["lmdb"])
    planted = folder / name
    os.symlink(victim, planted) if how == "symlink" else os.link(victim, planted)
    with pytest.raises(StorageError, match=rf"{planted}: .*(symlink|hard link)"):
        feedpipe.open_dataset(urls["lmdb"], cache_dir=tmp_path / "cache")
    assert victim.read_bytes() == VICTIM


def test_a_linked_data_file_is_never_opened(http_packed, tmp_path):
    """A cached data file is opened without following links (one inside the folder too)."""
    server, urls = http_packed
    server.faults([])
    folder = _folder(tmp_path / "cache", urls["lmdb"])
    (folder / "elsewhere.bin").write_bytes(VICTIM)
    os.symlink("elsewhere.bin", folder / "data.mdb")
    with pytest.raises(StorageError, match=r"data.mdb: a symlink in the cache"):
        feedpipe.open_dataset(urls["lmdb"], cache_dir=tmp_path / "cache")


def test_fifo_as_download_lock_is_refused(http_packed, tmp_path):
    server, urls = http_packed
    server.faults([])
    folder = _folder(tmp_path / "cache", urls["lmdb"])
    os.mkfifo(folder / ".data.mdb.lock")
    with pytest.raises(StorageError, match=r"\.data\.mdb\.lock: in the cache, is not a regular"):
        feedpipe.open_dataset(urls["lmdb"], cache_dir=tmp_path / "cache")


def test_planted_cache_wide_lock_is_refused(http_packed, tmp_path):
    server, urls = http_packed
    server.faults([])
    victim = _victim(tmp_path)
    (tmp_path / "cache").mkdir()
    os.symlink(victim, tmp_path / "cache" / ".lock")
    with pytest.raises(StorageError, match=r"cache/\.lock: a symlink"):
        feedpipe.open_dataset(urls["lmdb"], cache_dir=tmp_path / "cache", cache_limit="1GB")
    assert victim.read_bytes() == VICTIM


def test_a_linked_dataset_folder_is_refused(http_packed, tmp_path):
    """A dataset folder replaced by a link to a folder elsewhere: never written into."""
    server, urls = http_packed
    server.faults([])
    folder = _folder(tmp_path / "cache", urls["wds"])
    folder.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, folder)
    with pytest.raises(StorageError, match="not a folder"):
        feedpipe.open_dataset(urls["wds"], cache_dir=tmp_path / "cache")
    assert list(elsewhere.iterdir()) == []


def test_world_writable_cache_is_refused_sticky_is_not(http_packed, tmp_path):
    server, urls = http_packed
    server.faults([])
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    with pytest.raises(StorageError, match=rf"{cache}: .*writable by every user.*chmod o-w"):
        feedpipe.open_dataset(urls["lmdb"], cache_dir=cache)
    assert list(cache.iterdir()) == []  # nothing made in it
    cache.chmod(0o1777)  # as /tmp: others cannot remove or rename what is ours
    assert len(feedpipe.open_dataset(urls["lmdb"], cache_dir=cache)) == 72


@as_root
def test_cache_of_another_user_is_refused(http_packed, tmp_path):
    server, urls = http_packed
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    os.chown(cache, NOBODY, NOBODY)
    with pytest.raises(StorageError, match=rf"{cache}: the cache folder belongs to user id"):
        feedpipe.open_dataset(urls["lmdb"], cache_dir=cache)


@as_root
def test_group_shared_cache(http_packed, tmp_path):
    """A setgid group folder of another user: shared by the group (what its members made is
    used, and what feedpipe makes is group-writable); a file of another group is refused."""
    server, urls = http_packed
    server.faults([])
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, NOBODY, os.getegid())
    cache.chmod(0o2770)
    assert len(feedpipe.open_dataset(urls["lmdb"], cache_dir=cache)) == 72
    folder = _folder(cache, urls["lmdb"])
    mode = folder.stat().st_mode
    assert mode & stat.S_ISGID and mode & stat.S_IWGRP
    assert (folder / ".data.mdb.lock").stat().st_mode & stat.S_IWGRP
    os.chown(folder / "data.mdb", NOBODY, os.getegid())  # fetched by another member
    assert len(feedpipe.open_dataset(urls["lmdb"], cache_dir=cache)) == 72
    os.chown(folder / "data.mdb", NOBODY, NOBODY)  # planted by someone outside the group
    with pytest.raises(StorageError, match=rf"{folder / 'data.mdb'}: .*made by user id"):
        feedpipe.open_dataset(urls["lmdb"], cache_dir=cache)
