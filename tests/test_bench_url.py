"""``feedpipe bench URL``: a dataset in object storage benchmarked through the node-local cache,
against moto's S3 server on 127.0.0.1 (tests/servers.py); credentials never reach the report."""

from __future__ import annotations

import json

import pytest
from fp_helpers import cli_main

pytest.importorskip("s3fs")
from servers import cli_opts  # noqa: E402

SECRET = "bench-secret-5e1f9c"  # moto takes any credentials; this one must not be written


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_cli_bench_on_s3_url(moto_s3, s3_packed, packed, fmt, tmp_path, capsys):
    _, options = moto_s3
    cache, out = tmp_path / "cache", tmp_path / "b.json"
    rc, stdout, _ = cli_main(capsys, "bench", s3_packed[fmt], "--workers", "0,1", "--batches",
                             "3", "--batch-size", "4", "--size", "32", "-q", "--json", out,
                             "--cache-dir", cache, "--cache-limit", "1GB",
                             *cli_opts({**options, "secret": SECRET}))
    assert rc == 0
    text = out.read_text()
    assert SECRET not in text and SECRET not in stdout
    d = json.loads(text)
    assert d["dataset"]["path"] == s3_packed[fmt] and d["dataset"]["format"] == fmt
    assert d["dataset"]["cache_dir"] == str(cache) and d["dataset"]["cache_limit"] == 10**9
    assert [t["workers"] for t in d["trials"]] == [0, 1]
    assert all(t["status"] == "ok" and t["samples_per_s"] > 0 for t in d["trials"])
    # the data files were fetched into the cache given, whole and verified
    names = {f.name for f in (packed[fmt]).iterdir() if f.is_file()}
    cached = {p.name for p in cache.rglob("*") if p.is_file()}
    data = {n for n in names if n.endswith((".tar", ".mdb", ".h5"))}
    assert data and data <= cached


def test_run_bench_keeps_storage_options_out_of_the_report(moto_s3, s3_packed, tmp_path):
    from feedpipe.tools.bench import BenchConfig, run_bench

    _, options = moto_s3
    opts = {**options, "secret": SECRET}
    report = run_bench(s3_packed["wds"], BenchConfig(workers=(0,), batches=2, batch_sizes=(4,),
                                                     size=32), cache_dir=tmp_path,
                       storage_options=opts)
    assert report.trials[0].status == "ok" and report.trials[0].samples_per_s > 0
    assert SECRET not in json.dumps(report.to_json())
    assert options["client_kwargs"]["endpoint_url"] not in json.dumps(report.to_json())


def test_run_bench_reads_a_file_url(packed):
    from feedpipe.tools.bench import BenchConfig, run_bench

    report = run_bench(f"file://{packed['lmdb']}", BenchConfig(workers=(0,), batches=2,
                                                                batch_sizes=(4,), size=32))
    assert report.dataset["format"] == "lmdb" and report.trials[0].samples_per_s > 0
