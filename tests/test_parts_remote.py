"""Parts and merge in object storage, against moto's S3 server on 127.0.0.1:
``convert -o s3://... --part i/N`` uploads each part under ``parts/``, ``merge s3://...`` writes
the index files and the manifest last without copying shards, and the merged dataset reads
(through the remote cache, whose shard names hold ``/``) and verifies like a local merge. Also a
mix of a local LMDB and a remote WebDataset against two local copies."""

from __future__ import annotations

import pytest
import torch
from fp_helpers import cli_main, loader_batches, same_batches

from feedpipe import Mix, Output, Remote

pytest.importorskip("s3fs")
from servers import cli_opts, objects, upload_tree  # noqa: E402

import feedpipe  # noqa: E402
from converters import convert  # noqa: E402
from converters.merge import merge  # noqa: E402
from converters.parts import Part  # noqa: E402
from feedpipe.dataset.manifest import MANIFEST_NAME  # noqa: E402
from feedpipe.dataset.verify import read_manifest, verify  # noqa: E402
from feedpipe.errors import BadInputError, ConfigError  # noqa: E402

KW = dict(size=32, crop="resize", device="cpu", num_workers=0, output=Output(dtype="uint8"))


def test_cli_parts_to_s3_merge_in_place_read_and_verify(photo_dir, s3, tmp_path, capsys):
    bucket, opts, fs = s3
    url = f"{bucket}/ds"
    for i in range(2):  # the CLI kept the URL as a path before: 's3:/bucket/...' failed
        rc, out, err = cli_main(capsys, "convert", photo_dir, "--to", "wds", "-o", url,
                                "--part", f"{i}/2", "--workers", "0", *cli_opts(opts))
        assert rc == 0, err
    parts = objects(fs, url)
    assert MANIFEST_NAME not in parts  # parts only: nothing reads the prefix as a dataset yet
    for i in range(2):
        assert f"parts/{Part(i, 2).name}/{MANIFEST_NAME}" in parts
    assert not any(n.startswith(".") or "/." in n for n in parts)  # no journal left
    assert not (tmp_path / "s3:").exists() and not list(tmp_path.glob("**/s3:"))

    rc, out, err = cli_main(capsys, "merge", url, *cli_opts(opts))
    assert rc == 0 and "merged 2 parts" in out, err
    after = objects(fs, url)
    assert {n: after[n] for n in parts} == parts  # shards stay where they are, unchanged
    m = read_manifest(url, opts)
    shards = [f.name for f in m.files if f.name.endswith(".tar")]
    assert shards and all(s.startswith("parts/part-0000") for s in shards)
    assert set(after) == {MANIFEST_NAME, *(f.name for f in m.files)}

    local = tmp_path / "local"  # the same parts merged locally: the same dataset
    for i in range(2):
        convert(photo_dir, local, to="wds", workers=0, part=Part(i, 2))
    merge(local)
    assert feedpipe.open_dataset(local).manifest.files == m.files

    ref = loader_batches(local, seed=3, **KW)
    got = loader_batches(Remote(url, cache_dir=tmp_path / "cache", storage_options=opts), seed=3,
                         **KW)
    assert same_batches(ref, got) and len(ref) == 9
    report = verify(url, storage_options=opts)
    assert report.ok, report.problems
    assert report.records_checked == 72
    rc, out, err = cli_main(capsys, "verify", url, *cli_opts(opts))
    assert rc == 0 and "OK" in out, err


def test_remote_merge_refusals(photo_dir, s3):
    bucket, opts, fs = s3
    url = f"{bucket}/ds"
    with pytest.raises(ConfigError, match="--to wds"):
        convert(photo_dir, url, to="lmdb", workers=0, part=Part(0, 2), storage_options=opts)
    assert not objects(fs, url)
    convert(photo_dir, url, to="wds", workers=0, part=Part(0, 2), storage_options=opts)
    with pytest.raises(BadInputError, match="1 of 2 parts missing: part-00001-of-00002"):
        merge(url, storage_options=opts)
    assert MANIFEST_NAME not in objects(fs, url)
    fs.pipe_file(url.removeprefix("s3://") + "/notes.txt", b"mine")
    convert(photo_dir, url, to="wds", workers=0, part=Part(1, 2), storage_options=opts)
    with pytest.raises(BadInputError, match="notes.txt"):
        merge(url, storage_options=opts)
    fs.rm_file(url.removeprefix("s3://") + "/notes.txt")
    fs.rm_file(url.removeprefix("s3://") + "/index-keys.npy")  # as if the last merge was killed
    merge(url, storage_options=opts)  # a re-run finishes it
    assert verify(url, storage_options=opts, decode=False).ok
    with pytest.raises(BadInputError, match="already a complete dataset"):
        merge(url, storage_options=opts)
    before = objects(fs, url)
    with pytest.raises(ConfigError, match="already a merged dataset"):
        convert(photo_dir, url, to="wds", workers=0, part=Part(1, 2), storage_options=opts,
                overwrite=True)
    assert objects(fs, url) == before


def test_mix_of_local_lmdb_and_remote_wds_equals_two_local(packed, s3, tmp_path):
    bucket, opts, _ = s3
    url = f"{bucket}/wds"
    upload_tree(packed["wds"], url, opts)
    kw = dict(KW, seed=11, fields=["image", "label", "source"])
    ref = loader_batches(Mix([packed["lmdb"], packed["wds"]], weights=[0.6, 0.4]), **kw)
    remote = Remote(url, storage_options=opts, cache_dir=tmp_path / "cache")
    got = loader_batches(Mix([packed["lmdb"], remote], weights=[0.6, 0.4]), **kw)
    assert same_batches(ref, got) and len(ref) >= 9
    sources = torch.cat([b["source"] for b in got])
    assert set(sources.tolist()) == {0, 1}  # both datasets feed the mix
