"""The data-file fetch path (fsspec's ranged GETs) against moto's S3 server behind the fault
proxy (tests/servers.py): same batches as local, signed with the storage_options' credentials
only; retries, resume after a cut, and typed errors naming the URL."""

from __future__ import annotations

import pytest
from fp_helpers import remote_batches as batches
from fp_helpers import same_batches

from feedpipe import Remote
from feedpipe.errors import AccessDeniedError, RemoteNotFoundError, StorageError
from feedpipe.storage import RetryPolicy, download

pytest.importorskip("s3fs")
FAST = RetryPolicy(attempts=4, base=0.01, cap=0.05)
ENV = {"AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "envsecret",
       "AWS_SESSION_TOKEN": "ENVTOKEN"}


def data_gets(proxy, suffix=(".tar", ".mdb")):
    return [e for e in proxy.log() if e["method"] == "GET" and e["path"].endswith(suffix)]


@pytest.fixture
def shard(packed, s3_packed):
    """(URL, bytes) of the test run's first S3 shard."""
    data = (packed["wds"] / "shard-000000.tar").read_bytes()
    return f"{s3_packed['wds']}/shard-000000.tar", data


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_batches_equal_local(moto_s3, s3_packed, packed, fmt, tmp_path):
    proxy, options = moto_s3
    proxy.faults([])
    remote = batches(Remote(s3_packed[fmt], cache_dir=tmp_path, storage_options=options))
    assert same_batches(batches(packed[fmt]), remote) and len(remote) == 9
    gets = data_gets(proxy)
    assert gets and all(e["key_id"] == "testing" for e in gets)  # the storage_options' key signs


def test_signs_with_the_options_credentials_only(moto_s3, shard, tmp_path, monkeypatch):
    """AWS_* variables in the environment, a session token among them: the storage_options'
    key signs, and the environment's token is not sent with it."""
    proxy, options = moto_s3
    url, data = shard
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    proxy.faults([])
    download(url, tmp_path / "part", 2000, options, FAST)
    assert (tmp_path / "part").read_bytes() == data[:2000]
    [get] = data_gets(proxy)
    assert (get["key_id"], get["token"]) == ("testing", None)


def test_5xx_and_throttling_then_recovery(moto_s3, shard, tmp_path):
    proxy, options = moto_s3
    url, data = shard
    faults = [500, 503, 429]  # one fewer than FAST's attempts
    proxy.faults([{"kind": "status", "status": s, "times": 1, "match": "shard-000000"}
                  for s in faults])
    download(url, tmp_path / "part", len(data), options, FAST, chunk=len(data))
    assert (tmp_path / "part").read_bytes() == data
    statuses = [e["status"] for e in data_gets(proxy)]  # s3fs and botocore retry inside a try
    assert statuses[-1] == 206 and set(statuses[:-1]) == set(faults)


def test_cut_mid_body_resumes_with_range(moto_s3, shard, tmp_path):
    """The second chunk's connection is cut mid-body: the retry asks for that chunk again (a
    Range past 0); the bytes already on disk are never fetched again."""
    proxy, options = moto_s3
    url, data = shard
    chunk = len(data) // 3 + 1
    proxy.faults([{"kind": "drop", "after": 1000, "times": 1, "skip": 1,
                   "match": "shard-000000"}])
    download(url, tmp_path / "part", len(data), options, FAST, chunk=chunk)
    assert (tmp_path / "part").read_bytes() == data
    gets = data_gets(proxy)
    starts = [int(e["range"].split("=")[1].split("-")[0]) for e in gets]
    assert starts == [0, chunk, chunk, 2 * chunk]
    assert [e["bytes"] for e in gets][1] == -1  # the cut one
    assert sum(e["bytes"] for e in gets if e["bytes"] > 0) == len(data)


def test_denied_fails_at_once(moto_s3, shard, tmp_path):
    proxy, options = moto_s3
    url, data = shard
    proxy.faults([{"kind": "status", "status": 403, "times": -1}])
    with pytest.raises(AccessDeniedError, match=f"{url}.*AWS_ACCESS_KEY_ID") as err:
        download(url, tmp_path / "part", len(data), options, FAST)
    assert err.value.url == url and "Debug source" not in str(err.value)
    assert len(proxy.log()) == 1


def test_missing_fails_at_once(moto_s3, s3_packed, tmp_path):
    proxy, options = moto_s3
    url = f"{s3_packed['wds']}/shard-999999.tar"
    proxy.faults([])
    with pytest.raises(RemoteNotFoundError, match="shard-999999.tar.*check the path"):
        download(url, tmp_path / "part", 100, options, FAST)
    assert len(proxy.log()) == 1


def test_exhausted_names_the_url(moto_s3, shard, tmp_path):
    proxy, options = moto_s3
    url, data = shard
    proxy.faults([{"kind": "status", "status": 500, "times": -1, "match": "shard-000000"}])
    with pytest.raises(StorageError, match=f"{url}: downloading bytes 0-.* 4 times"):
        download(url, tmp_path / "part", len(data), options, FAST)
    assert len(proxy.log()) >= FAST.attempts
    proxy.faults([])
