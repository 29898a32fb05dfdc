"""gs:// against a real GCS JSON-API server on 127.0.0.1: gcp-storage-emulator behind the fault
proxy (tests/servers.py), reached the ways gcsfs documents (``endpoint_url`` in storage_options,
or ``STORAGE_EMULATOR_HOST``). Remote batches are the local batches, each data file fetched once
with ranged GETs; ``convert -o gs://`` then ``verify``; a missing path fails typed, naming it."""

from __future__ import annotations

import os
from urllib.parse import unquote

import pytest
from fp_helpers import cli_main, loader_batches, same_batches

from feedpipe import Output, Remote

pytest.importorskip("gcsfs")
pytest.importorskip("gcp_storage_emulator")
from servers import cli_opts, objects  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from feedpipe.dataset.manifest import MANIFEST_NAME, Manifest  # noqa: E402
from feedpipe.errors import AccessDeniedError, BadInputError, RemoteNotFoundError  # noqa: E402
from feedpipe.storage import RetryPolicy, download, upload  # noqa: E402

FAST = RetryPolicy(attempts=4, base=0.01, cap=0.05)
KW = dict(size=48, device="cpu", seed=5, num_workers=0, output=Output(dtype="uint8"))
MEDIA = "/download/storage/v1/b/"  # the JSON API's media download: the object's bytes


def media_gets(proxy) -> list[dict]:
    """The proxy's successful GETs of object bytes, each with its object key as ``name``."""
    return [{**e, "name": unquote(e["path"]).rsplit("/", 1)[1]} for e in proxy.log()
            if e["method"] == "GET" and e["path"].startswith(MEDIA) and e["status"] in (200, 206)]


@pytest.mark.parametrize("fmt", ["wds", "hdf5"])
def test_gs_batches_equal_local(gcs, gcs_packed, packed, fmt, tmp_path):
    proxy, options = gcs
    local = loader_batches(packed[fmt], **KW)
    proxy.faults([])
    remote = loader_batches(Remote(gcs_packed[fmt], cache_dir=tmp_path, storage_options=options),
                            **KW)
    assert same_batches(local, remote) and len(local) == 9
    again = loader_batches(Remote(gcs_packed[fmt], cache_dir=tmp_path, storage_options=options),
                           **KW)
    assert same_batches(local, again)  # the second run reads the cache
    data = [e for e in media_gets(proxy) if not e["name"].endswith(("feedpipe.json", ".npy"))]
    files = {f.name: f.size for f in feedpipe.open_dataset(packed[fmt]).manifest.files
             if not f.name.startswith("index-")}
    assert sorted(e["name"] for e in data) == sorted(files)  # each data file once, two runs
    for e in data:  # fetched by ranged GETs, which the emulator answers 206
        assert e["range"] == f"bytes=0-{files[e['name']] - 1}" and e["status"] == 206, e


def test_emulator_host_from_the_environment(gcs, gcs_packed, packed, tmp_path, monkeypatch):
    """``STORAGE_EMULATOR_HOST`` instead of ``endpoint_url``: gcsfs follows it."""
    proxy, _ = gcs
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    proxy.faults([])
    options = {"token": "anon"}
    remote = loader_batches(Remote(gcs_packed["wds"], cache_dir=tmp_path, storage_options=options),
                            **KW)
    assert same_batches(loader_batches(packed["wds"], **KW), remote)
    assert {e["name"] for e in media_gets(proxy)} >= {"shard-000000.tar", "feedpipe.json"}


def test_large_object_round_trip(gcs, gs, tmp_path):
    """A 6 MiB object: gcsfs uploads it in a resumable session (over 5 MiB), and a download
    in 1 MiB ranged GETs, resumed from a partial file, gets the same bytes."""
    proxy, _ = gcs
    bucket, opts, _ = gs
    data = os.urandom(6 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    url = f"{bucket}/big.bin"
    proxy.faults([])
    upload(tmp_path / "big.bin", url, opts, FAST)
    sent = [e["query"] for e in proxy.log() if e["path"].startswith("/upload/")]
    assert len(sent) == 2 and "uploadType=resumable" in sent[0] and "upload_id=" in sent[1], \
        sent  # a resumable session opened, then its data sent to it
    part = tmp_path / ".big.bin.part"
    part.write_bytes(data[:1000])
    proxy.faults([])
    download(url, part, len(data), opts, FAST, chunk=1 << 20)
    assert part.read_bytes() == data
    ranges = [e["range"] for e in media_gets(proxy)]
    assert ranges[0] == f"bytes=1000-{1000 + (1 << 20) - 1}" and len(ranges) == 6


def test_convert_to_gs_then_verify(photo_dir, gs, tmp_path, capsys):
    bucket, opts, fs = gs
    url = f"{bucket}/ds/"
    rc, out, err = cli_main(capsys, "convert", photo_dir, "--to", "wds", "-o", url,
                            "--shard-count", "10", "--workers", "0", "-q", *cli_opts(opts))
    assert rc == 0, err
    local = tmp_path / "local"
    convert(photo_dir, local, to="wds", workers=0, writer_options={"shard_count": 10})
    held = objects(fs, url)
    m = Manifest.read(local)
    assert set(held) == {MANIFEST_NAME, *(f.name for f in m.files)}  # no journal left
    for f in m.files:  # the same bytes as a local conversion
        assert held[f.name] == (local / f.name).read_bytes(), f.name
    rc, out, err = cli_main(capsys, "verify", url, *cli_opts(opts))
    assert rc == 0 and "OK" in out, err
    key = f"{url.removeprefix('gs://')}shard-000002.tar"
    damaged = bytearray(held["shard-000002.tar"])
    damaged[700] ^= 0xFF
    fs.pipe_file(key, bytes(damaged))
    rc, out, _ = cli_main(capsys, "verify", url, *cli_opts(opts))
    assert rc == 1 and "shard-000002.tar: checksum mismatch" in out


def test_missing_and_denied_fail_typed(gcs, gcs_packed, tmp_path):
    proxy, options = gcs
    proxy.faults([])
    with pytest.raises(BadInputError, match="gs://feedpipe-test/nope.*feedpipe.json"):
        feedpipe.open_dataset("gs://feedpipe-test/nope", cache_dir=tmp_path,
                              storage_options=options)
    missing = f"{gcs_packed['wds']}/shard-000099.tar"
    proxy.faults([])
    with pytest.raises(RemoteNotFoundError, match=f"{missing}: not found"):
        download(missing, tmp_path / ".part", 10, options, FAST)
    assert [e["status"] for e in proxy.log()] == [404]  # at once, no retry
    for status in (401, 403):  # gcsfs raises an HttpError with a code, and a bare OSError
        proxy.faults([{"kind": "status", "status": status, "times": -1}])
        with pytest.raises(AccessDeniedError, match="GOOGLE_APPLICATION_CREDENTIALS"):
            feedpipe.open_dataset(gcs_packed["wds"], cache_dir=tmp_path, storage_options=options)
        assert len(proxy.log()) == 1  # at once, no retry
    proxy.faults([])
