"""feedpipe.storage.Store: a local directory and an S3 prefix (moto on 127.0.0.1) behave alike
through one interface, which merge (one MergeTarget for both) writes through."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from servers import upload_tree

from feedpipe.errors import RemoteNotFoundError
from feedpipe.storage.store import DirStore, Store, UrlStore, open_store


@pytest.fixture(params=["dir", "s3"])
def store(request, tmp_path) -> Store:
    if request.param == "dir":
        (tmp_path / "ds").mkdir()
        return open_store(tmp_path / "ds")
    bucket, opts, _fs = request.getfixturevalue("s3")
    return open_store(f"{bucket}/ds", opts)


def test_open_store_picks_by_target(tmp_path):
    assert isinstance(open_store(tmp_path), DirStore)
    assert isinstance(open_store("s3://bucket/ds", {"anon": True}), UrlStore)


def test_one_interface_for_both(store: Store, tmp_path):
    """Write atomically (returning size and SHA-256), list recursively, read, size, and fetch a
    local copy; a missing name is a FileNotFoundError either way."""
    data = b"feedpipe" * 1000
    if not store.remote:  # a local write needs its folder (a merge's parts are there)
        (Path(store.url) / "parts" / "p-1").mkdir(parents=True)
    got = store.write("parts/p-1/a.bin", lambda fh: fh.write(data))
    assert got == (len(data), hashlib.sha256(data).hexdigest())
    store.write("top.npy", lambda fh: fh.write(b"x"))
    assert store.names() == {"parts/p-1/a.bin", "top.npy"}
    assert store.read_bytes("parts/p-1/a.bin") == data
    assert store.size("parts/p-1/a.bin") == len(data)
    local = store.local("parts/p-1/a.bin", tmp_path / "into")
    assert local.read_bytes() == data
    assert store.where("top.npy") == f"{store.url}/top.npy"
    with pytest.raises(FileNotFoundError):
        store.read_bytes("nope.bin")
    if store.remote:
        with pytest.raises(RemoteNotFoundError):
            store.size("nope.bin")


def test_a_failed_write_leaves_nothing(store: Store):
    """A writer that raises leaves no file under the name (nor a temporary one listed)."""
    def boom(fh):
        fh.write(b"half")
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError):
        store.write("index.npy", boom)
    assert store.names() == set()


def test_verify_takes_a_folder_or_a_url(s3, packed):
    """One verify for both: a URL is checked object by object and record by record like the
    folder it was uploaded from (it was refused: verify took folders only)."""
    from feedpipe.dataset.verify import verify

    bucket, opts, _fs = s3
    url, local = f"{bucket}/wds", packed["wds"]
    upload_tree(local, url, opts)
    remote, here = verify(url, storage_options=opts), verify(local)
    assert remote.ok and here.ok, (remote.problems, here.problems)
    assert (remote.files_checked, remote.records_checked) == \
        (here.files_checked, here.records_checked) > (0, 0)


def test_doctor_reads_a_url_dataset_like_a_folder(s3, packed):
    """doctor's dataset facts and storage findings of a URL are its folder's (they were refused:
    `doctor URL` measured the network only)."""
    from dataclasses import replace

    from feedpipe.tools.doctor import check_dataset, dataset_facts

    bucket, opts, _fs = s3
    url = f"{bucket}/wds"
    upload_tree(packed["wds"], url, opts)
    here, there = dataset_facts(packed["wds"]), dataset_facts(url, opts)
    assert there == replace(here, path=url, fs_type=None)
    assert there.format == "wds" and there.files > 1
    assert check_dataset(there) == check_dataset(replace(here, fs_type=None))


def test_put_publishes_a_staged_file_and_remove_deletes_names(store: Store, tmp_path):
    """put() publishes a finished local file under a name (a folder renames it in: no copy, the
    same inode; an object store uploads it); remove() deletes names, missing ones included."""
    staged = tmp_path / "staged" / "shard.tar"
    staged.parent.mkdir()
    staged.write_bytes(b"tar" * 5000)
    inode = staged.stat().st_ino
    store.put("sub/shard-000000.tar", staged)
    assert store.read_bytes("sub/shard-000000.tar") == b"tar" * 5000
    if store.remote:
        assert staged.exists()  # the caller's to remove (a re-run may hash it again)
    else:
        assert not staged.exists()
        assert (Path(store.url) / "sub/shard-000000.tar").stat().st_ino == inode
    store.write("keep.json", lambda fh: fh.write(b"{}"))
    store.remove(["sub/shard-000000.tar", "never-there.tar"])
    store.remove([])
    assert store.names() == {"keep.json"}


def test_bucket_exists(s3):
    bucket, opts, _fs = s3
    assert UrlStore(f"{bucket}/ds", opts).bucket_exists()
    assert not UrlStore("s3://no-such-bucket-feedpipe/ds", opts).bucket_exists()
