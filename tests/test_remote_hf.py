"""hf:// datasets, read through huggingface_hub's HfFileSystem from a Hugging Face Hub on
127.0.0.1 (tests/servers.py: the fault server in its ``--hf`` mode, the ``hf_hub`` fixture):
remote batches are the local batches, a revision in the URL is followed, a missing path or a
refused token fails typed naming the URL, and faults recover to the same batches."""

from __future__ import annotations

import pytest
from fp_helpers import cli_main, data_files, run_cli, same_batches
from fp_helpers import remote_batches as batches
from hub_emulator import HubRepos

import feedpipe
from feedpipe import Remote, Workers
from feedpipe.errors import AccessDeniedError, BadInputError, RemoteNotFoundError
from feedpipe.storage import download, read_bytes, remote_size

pytest.importorskip("huggingface_hub")


def resolved(url: str, rev: str = "main") -> str:
    """The Hub's file path for ``hf://datasets/REPO/PATH`` (as the access log records it)."""
    org, name, path = url.removeprefix("hf://datasets/").split("/", 2)
    return f"/datasets/{org}/{name}/resolve/{rev}/{path}"


def test_hf_batches_equal_local(hf_hub, packed, tmp_path):
    """An epoch from the Hub is the local epoch; each shard is fetched once, whole and no more
    (over two runs: the second reads the cache)."""
    server, urls = hf_hub
    server.faults([])
    local = batches(packed["wds"])
    assert same_batches(local, batches(Remote(urls["photos"], cache_dir=tmp_path)))
    assert len(local) == 9
    assert same_batches(local, batches(Remote(urls["photos"], cache_dir=tmp_path)))
    want = {f"{resolved(urls['photos'])}/{name}": size
            for name, size in data_files(packed["wds"]).items()}
    assert server.fetched(".tar") == want


def test_hf_loader_workers_read_hf_endpoint(hf_hub, packed, tmp_path):
    """Spawned DataLoader workers import huggingface_hub afresh: they find the Hub through the
    inherited HF_ENDPOINT, and fetch the shards themselves (no prefetch in the parent)."""
    server, urls = hf_hub
    server.faults([])
    from feedpipe.dataset.remote import open_remote

    ds = open_remote(urls["photos"], cache_dir=tmp_path, prefetch=0)
    remote = batches(ds, num_workers=2, workers=Workers(multiprocessing_context="spawn"))
    assert same_batches(batches(packed["wds"]), remote)
    assert set(server.fetched(".tar")) == {f"{resolved(urls['photos'])}/{n}"
                                           for n in data_files(packed["wds"])}


def test_hf_revision_in_the_url(hf_hub, packed, tmp_path):
    """``REPO@REV/path``: a branch, its commit id and a ``refs/pr/N`` ref each read their own
    tree (branch v1 holds the lmdb dataset, main the wds one)."""
    server, urls = hf_hub
    server.faults([])
    base = "hf://datasets/feedpipe/photos"
    commit = HubRepos.commit("dataset", "feedpipe/photos", "v1")
    for rev in ("v1", commit):
        ds = feedpipe.open_dataset(f"{base}@{rev}/ds", cache_dir=tmp_path)
        assert ds.manifest.format == "lmdb"
    assert feedpipe.open_dataset(f"{base}@refs/pr/1/ds", cache_dir=tmp_path).manifest.format == "wds"
    assert feedpipe.open_dataset(urls["photos"], cache_dir=tmp_path).manifest.format == "wds"
    remote = batches(Remote(f"{base}@v1/ds", cache_dir=tmp_path))
    assert same_batches(batches(packed["lmdb"]), remote)
    data = [e["path"] for e in server.log() if e["path"].endswith("data.mdb")]
    assert data and set(data) == {f"/datasets/feedpipe/photos/resolve/{r}/ds/data.mdb"
                                  for r in ("v1", commit)}  # each revision's own copy


def test_hf_missing_path_and_refused_token_fail_typed(hf_hub, tmp_path):
    server, urls = hf_hub
    server.faults([])
    for url in ("hf://datasets/feedpipe/photos/nope", "hf://datasets/feedpipe/nope/ds",
                "hf://datasets/feedpipe/photos@nope/ds"):
        with pytest.raises(BadInputError, match=f"{url}: no feedpipe.json"):
            feedpipe.open_dataset(url, cache_dir=tmp_path)
    shard = f"{urls['photos']}/shard-999999.tar"
    with pytest.raises(RemoteNotFoundError, match=f"{shard}: not found") as err:
        remote_size(shard)
    assert err.value.url == shard
    with pytest.raises(RemoteNotFoundError, match=shard):
        download(shard, tmp_path / "part", 10)
    server.faults([{"kind": "status", "status": 403, "times": -1, "match": "/resolve/"}])
    with pytest.raises(AccessDeniedError, match="HF_TOKEN"):
        read_bytes(f"{urls['photos']}/feedpipe.json")
    assert len([e for e in server.log() if e["status"] == 403]) == 1  # at once, no retry
    server.faults([])


def test_hf_faults_recover_to_the_same_batches(hf_hub, packed, tmp_path):
    """503s and a connection cut on the shards (huggingface_hub's own retries), 503s on the API
    and a manifest cut twice mid-body (huggingface_hub gives up: feedpipe's retries): the
    batches are the local ones."""
    server, urls = hf_hub
    server.faults([{"kind": "status", "status": 503, "times": 2, "match": ".tar"},
                   {"kind": "drop", "after": 3000, "times": 1, "match": ".tar"},
                   {"kind": "status", "status": 503, "times": 2, "match": "/api/datasets/"},
                   {"kind": "drop", "after": 10, "times": 2, "match": "feedpipe.json"}])
    remote = batches(Remote(urls["faults"], cache_dir=tmp_path))
    assert same_batches(batches(packed["wds"]), remote)
    log = server.log()
    assert [e["status"] for e in log].count(503) == 4
    assert sum(e["bytes"] == -1 for e in log) == 3  # every cut happened
    fetched = server.fetched(".tar")
    assert set(fetched) == {f"{resolved(urls['faults'])}/{n}" for n in data_files(packed["wds"])}


def test_hf_ranged_download_asks_for_exactly_its_chunks(hf_hub, packed, tmp_path):
    """HfFileSystem's buffered file reads ahead a block past a range; a chunked download must
    ask for its chunks only, so every byte is fetched once."""
    server, urls = hf_hub
    server.faults([])
    name = "shard-000001.tar"
    size = data_files(packed["wds"])[name]
    chunk = 4096
    download(f"{urls['photos']}/{name}", tmp_path / "part", size, chunk=chunk)
    assert (tmp_path / "part").read_bytes() == (packed["wds"] / name).read_bytes()
    gets = [e for e in server.log() if e["path"].endswith(name)]
    assert [e["range"] for e in gets] == [f"bytes={s}-{min(s + chunk, size) - 1}"
                                         for s in range(0, size, chunk)]
    assert sum(e["bytes"] for e in gets) == size


def test_hf_cli_info_and_verify(hf_hub, packed, capsys):
    """``feedpipe info`` in a fresh process (huggingface_hub reads HF_ENDPOINT on import), and
    ``verify``: OK, then a shard the Hub serves damaged is named by its hf:// URL."""
    server, urls = hf_hub
    server.faults([])
    proc = run_cli("info", urls["photos"], check=True)
    assert f"{urls['photos']}: wds" in proc.stdout and "72 samples" in proc.stdout
    rc, out, err = cli_main(capsys, "verify", urls["photos"])
    assert rc == 0 and "OK" in out, err
    server.faults([{"kind": "corrupt", "times": -1, "match": "shard-000002.tar"}])
    rc, out, _ = cli_main(capsys, "verify", urls["photos"])
    assert rc == 1 and f"{urls['photos']}/shard-000002.tar: checksum mismatch" in out
    server.faults([])
