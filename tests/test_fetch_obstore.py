"""The data-file fetch path through either client (``FEEDPIPE_FETCH``: fsspec or obstore), against
moto's S3 server behind the fault proxy (tests/servers.py): same batches as local, the same
retry and resume semantics, typed errors naming the URL; which client ``auto`` picks and that it
never changes the credentials; and obstore kept fork-safe for DataLoader workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fp_helpers import batch_digests, same_batches
from fp_helpers import remote_batches as batches

from feedpipe import Remote
from feedpipe.errors import (
    AccessDeniedError,
    ConfigError,
    RemoteNotFoundError,
    RetriesExhaustedError,
)
from feedpipe.storage import RetryPolicy, download
from feedpipe.storage.fetch import FETCH_ENV, fetch_backend, obstore_spec

pytest.importorskip("obstore")
pytest.importorskip("s3fs")
FAST = RetryPolicy(attempts=4, base=0.01, cap=0.05)
BACKENDS = ["fsspec", "obstore"]
OBSTORE_AGENT = "object_store/"
PROBE = Path(__file__).with_name("fetch_fork_probe.py")
ENV = {"AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "envsecret",
       "AWS_SESSION_TOKEN": "ENVTOKEN"}


def data_gets(proxy, suffix=(".tar", ".mdb")):
    return [e for e in proxy.log() if e["method"] == "GET" and e["path"].endswith(suffix)]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """Each test once per fetch client, selected the way users do: FEEDPIPE_FETCH."""
    monkeypatch.setenv(FETCH_ENV, request.param)
    return request.param


@pytest.fixture
def shard(packed, s3_packed):
    """(URL, bytes) of the session's first S3 shard."""
    data = (packed["wds"] / "shard-000000.tar").read_bytes()
    return f"{s3_packed['wds']}/shard-000000.tar", data


# -- selection: which client, with which credentials -------------------------------------------
def test_s3_options_map_with_the_same_credentials():
    opts = {"key": "K", "secret": "S", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
            "config_kwargs": {"retries": {"max_attempts": 1}}, "skip_instance_cache": True}
    spec = obstore_spec("s3://b/ds/shard-000000.tar", opts, ENV)
    assert not isinstance(spec, str)
    assert (spec.root, spec.path) == ("s3://b", "ds/shard-000000.tar")
    assert spec.credentials == ("K", "S", None)  # not the environment's session token
    assert spec.config == {"region": "us-east-1", "endpoint": "http://127.0.0.1:9"}
    assert spec.client["allow_http"] is True
    spec = obstore_spec("s3://b/k", {}, {**ENV, "AWS_DEFAULT_REGION": "eu-west-1"})
    assert not isinstance(spec, str)
    assert spec.credentials == ("ENVKEY", "envsecret", "ENVTOKEN")
    assert spec.config == {"region": "eu-west-1"}
    spec = obstore_spec("s3://b/k", {"anon": True}, {"AWS_DEFAULT_REGION": "us-east-2", **ENV,
                                                     "AWS_CA_BUNDLE": "/etc/ca.pem"})
    assert not isinstance(spec, str)
    assert spec.credentials is None and spec.config["skip_signature"] is True
    assert spec.ca_bundle == "/etc/ca.pem" and not spec.client.get("allow_http")  # AWS: https


@pytest.mark.parametrize("url, opts, env, why", [
    ("s3://b/k", {"profile": "dev"}, ENV, "profile"),
    ("s3://b/k", {"session": object()}, ENV, "session"),
    ("s3://b/k", {"client_kwargs": {"endpoint_url": "http://h", "verify": False}}, ENV, "verify"),
    ("s3://b/k", {}, {**ENV, "AWS_PROFILE": "dev", "AWS_DEFAULT_REGION": "x"}, "AWS_PROFILE"),
    ("s3://b/k", {}, {"AWS_ENDPOINT_URL": "http://h"}, "AWS_ACCESS_KEY_ID"),  # botocore's chain
    ("s3://b/k", {}, ENV, "region"),  # AWS without a region: s3fs follows redirects
    ("s3://b/a b.tar", {"anon": True, "endpoint_url": "http://h"}, {}, "characters"),
    ("https://h/ds/x.tar", {"headers": {"Authorization": "t"}}, {}, "headers"),
    ("https://h/ds/x.tar", {}, {"HTTPS_PROXY": "http://p:3128"}, "HTTPS_PROXY"),
    ("https://h/ds/x.tar?sig=1", {}, {}, "query"),
    ("gs://b/k", {}, {}, "GOOGLE_APPLICATION_CREDENTIALS"),  # gcsfs's login/metadata chain
    ("hf://datasets/o/n/x.tar", {}, {}, "fsspec only"),
])
def test_unmappable_stays_on_fsspec(url, opts, env, why, monkeypatch):
    reason = obstore_spec(url, opts, env)
    assert isinstance(reason, str) and why in reason
    monkeypatch.setattr(os, "environ", {**env, FETCH_ENV: "auto"})
    assert fetch_backend(url, opts) == "fsspec"
    os.environ[FETCH_ENV] = "obstore"  # asked for explicitly: an error, never other credentials
    with pytest.raises(ConfigError, match=f"{FETCH_ENV}=obstore.*{url.split('?')[0]}"):
        fetch_backend(url, opts)


def test_selection_env(monkeypatch):
    opts = {"key": "K", "secret": "S", "endpoint_url": "http://127.0.0.1:9"}
    monkeypatch.setattr(os, "environ", {})
    assert fetch_backend("s3://b/k", opts) == "obstore"  # auto, mappable
    assert fetch_backend("gs://b/k", {"token": "anon"}) == "obstore"
    assert fetch_backend("http://127.0.0.1:9/ds/x.tar") == "obstore"
    os.environ[FETCH_ENV] = "fsspec"
    assert fetch_backend("s3://b/k", opts) == "fsspec"
    os.environ[FETCH_ENV] = "curl"
    with pytest.raises(ConfigError, match="FEEDPIPE_FETCH='curl'"):
        fetch_backend("s3://b/k", opts)


# -- the fetch path against the S3 server, once per client -------------------------------------
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_batches_equal_local(moto_s3, s3_packed, packed, fmt, backend, tmp_path):
    proxy, options = moto_s3
    proxy.faults([])
    remote = batches(Remote(s3_packed[fmt], cache_dir=tmp_path, storage_options=options))
    assert same_batches(batches(packed[fmt]), remote) and len(remote) == 9
    gets = data_gets(proxy)
    assert gets and all(e["agent"].startswith(OBSTORE_AGENT) == (backend == "obstore")
                        for e in gets)
    assert all(e["key_id"] == "testing" for e in gets)  # the storage_options' key signs
    meta = [e for e in proxy.log() if e["path"].endswith(("feedpipe.json", ".npy"))]
    assert meta and not any(e["agent"].startswith(OBSTORE_AGENT) for e in meta)  # fsspec


def test_obstore_signs_with_the_options_credentials_only(moto_s3, shard, tmp_path, monkeypatch):
    """obstore reads AWS_* variables itself: a session token in the environment must not be
    sent with the storage_options' key (botocore would not send it)."""
    proxy, options = moto_s3
    url, data = shard
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv(FETCH_ENV, "obstore")
    proxy.faults([])
    download(url, tmp_path / "part", 2000, options, FAST)
    assert (tmp_path / "part").read_bytes() == data[:2000]
    [get] = data_gets(proxy)
    assert get["agent"].startswith(OBSTORE_AGENT)
    assert (get["key_id"], get["token"]) == ("testing", None)


def test_5xx_and_throttling_then_recovery(moto_s3, shard, backend, tmp_path):
    proxy, options = moto_s3
    url, data = shard
    faults = [500, 503, 429]  # one fewer than FAST's attempts
    proxy.faults([{"kind": "status", "status": s, "times": 1, "match": "shard-000000"}
                  for s in faults])
    download(url, tmp_path / "part", len(data), options, FAST, chunk=len(data))
    assert (tmp_path / "part").read_bytes() == data
    statuses = [e["status"] for e in data_gets(proxy)]
    if backend == "obstore":  # its own retries are off: each request is one try of our policy
        assert statuses == [*faults, 206]
    else:  # s3fs and botocore retry inside a try as well
        assert statuses[-1] == 206 and set(statuses[:-1]) == set(faults)


def test_cut_mid_body_resumes_with_range(moto_s3, shard, backend, tmp_path):
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


def test_denied_fails_at_once(moto_s3, shard, backend, tmp_path):
    proxy, options = moto_s3
    url, data = shard
    proxy.faults([{"kind": "status", "status": 403, "times": -1}])
    with pytest.raises(AccessDeniedError, match=f"{url}.*AWS_ACCESS_KEY_ID") as err:
        download(url, tmp_path / "part", len(data), options, FAST)
    assert err.value.url == url and "Debug source" not in str(err.value)
    assert len(proxy.log()) == 1


def test_missing_fails_at_once(moto_s3, s3_packed, backend, tmp_path):
    proxy, options = moto_s3
    url = f"{s3_packed['wds']}/shard-999999.tar"
    proxy.faults([])
    with pytest.raises(RemoteNotFoundError, match="shard-999999.tar.*check the path"):
        download(url, tmp_path / "part", 100, options, FAST)
    assert len(proxy.log()) == 1


def test_exhausted_names_the_url(moto_s3, shard, backend, tmp_path):
    proxy, options = moto_s3
    url, data = shard
    proxy.faults([{"kind": "status", "status": 500, "times": -1, "match": "shard-000000"}])
    with pytest.raises(RetriesExhaustedError, match=f"{url}: downloading bytes 0-.* 4 times"):
        download(url, tmp_path / "part", len(data), options, FAST)
    tries = len(proxy.log())
    assert tries == FAST.attempts if backend == "obstore" else tries >= FAST.attempts
    proxy.faults([])


# -- fork safety --------------------------------------------------------------------------------
def test_forked_workers_after_a_remote_open(moto_s3, s3_packed, packed, tmp_path):
    """A fresh parent (FEEDPIPE_FETCH=obstore) opens the dataset, then 2 forked workers fetch the
    shards with obstore; after the parent itself starts obstore's runtime, newly forked workers
    fall back to fsspec instead of hanging. Both epochs equal the local batches."""
    proxy, _ = moto_s3
    proxy.faults([])
    out = tmp_path / "out.json"
    env = {**os.environ, FETCH_ENV: "obstore",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    proc = subprocess.Popen([sys.executable, str(PROBE), s3_packed["wds"], proxy.url,
                             str(tmp_path / "cache"), str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the probe and its workers: a hang fails here
        proc.communicate()
        raise
    assert proc.returncode == 0, log.decode()
    got = json.loads(out.read_text())
    want = batch_digests(batches(packed["wds"]))
    assert got["clean"] == want and got["after_parent_used_obstore"] == want
    assert not got["parent_used_obstore"] and got["parent_runtime_started"]
    tars = [e for e in data_gets(proxy, ".tar") if e["bytes"] > 1000]  # the shard fetches
    clean, tainted = tars[:4], tars[4:]  # 4 shards per epoch, each fetched once
    assert len(tars) == 8
    assert all(e["agent"].startswith(OBSTORE_AGENT) for e in clean)
    assert not any(e["agent"].startswith(OBSTORE_AGENT) for e in tainted)
