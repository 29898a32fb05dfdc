"""Converting into object storage, against moto's S3 server on 127.0.0.1: shards uploaded, the
manifest last, read back and verified; resume after a kill; --overwrite only removes feedpipe's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from fp_helpers import CLI, cli_main

pytest.importorskip("s3fs")
from servers import FaultServer, cli_opts, objects  # noqa: E402

from converters import convert  # noqa: E402
from converters.upload import JOURNAL  # noqa: E402
from feedpipe.dataset.manifest import MANIFEST_NAME, Manifest  # noqa: E402
from feedpipe.dataset.verify import read_manifest, verify  # noqa: E402
from feedpipe.errors import BadInputError  # noqa: E402
from feedpipe.tools.doctor import run_doctor  # noqa: E402


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_convert_to_s3_reads_back_and_verifies(tmp_path, photo_dir, s3, fmt, capsys):
    bucket, opts, fs = s3
    url = f"{bucket}/ds/"
    res = convert(photo_dir, url, to=fmt, workers=0, storage_options=opts,
                  writer_options={"shard_count": 10} if fmt == "wds" else None)
    local = convert(photo_dir, tmp_path / "local", to=fmt, workers=0,
                    writer_options={"shard_count": 10} if fmt == "wds" else None)
    held = objects(fs, url)
    m = Manifest.read(tmp_path / "local")
    assert set(held) == {MANIFEST_NAME, *(f.name for f in m.files)}  # no journal left
    for f in m.files:  # the same bytes as a local conversion
        assert held[f.name] == (tmp_path / "local" / f.name).read_bytes(), f.name
    assert res.written == local.written and res.bytes_out == local.bytes_out
    assert read_manifest(url, opts).files == m.files
    report = verify(url, storage_options=opts)
    assert report.ok, report.problems
    assert report.files_checked == len(m.files) and report.records_checked == res.written
    rc, out, err = cli_main(capsys, "verify", url, *cli_opts(opts))
    assert rc == 0 and "OK" in out, err
    rc, out, err = cli_main(capsys, "info", url, *cli_opts(opts))
    assert rc == 0 and f"{res.written} samples" in out, err
    assert not list((tmp_path / "xdg" / "feedpipe" / "staging").iterdir())


def test_verify_names_a_damaged_object(photo_dir, s3, capsys):
    bucket, opts, fs = s3
    url = f"{bucket}/ds"
    convert(photo_dir, url, to="wds", workers=0, storage_options=opts,
            writer_options={"shard_count": 10})
    key = url.removeprefix("s3://") + "/shard-000002.tar"
    data = bytearray(fs.cat_file(key))
    data[700] ^= 0xFF
    fs.pipe_file(key, bytes(data))
    report = verify(url, storage_options=opts)
    assert report.problems == [f"{url}/shard-000002.tar: checksum mismatch"]
    rc, out, _ = cli_main(capsys, "verify", url, *cli_opts(opts))
    assert rc == 1 and "shard-000002.tar: checksum mismatch" in out


def test_a_prefix_without_manifest_is_not_a_dataset(s3):
    bucket, opts, fs = s3
    fs.pipe_file(bucket.removeprefix("s3://") + "/ds/shard-000000.tar", b"x" * 10)
    with pytest.raises(BadInputError, match="no feedpipe.json"):
        read_manifest(f"{bucket}/ds", opts)


def test_overwrite_on_a_url_removes_only_what_the_old_manifest_lists(photo_dir, s3):
    bucket, opts, fs = s3
    url = f"{bucket}/ds"
    convert(photo_dir, url, to="wds", workers=0, storage_options=opts,
            writer_options={"shard_count": 10})
    before = objects(fs, url)
    with pytest.raises(FileExistsError, match="overwrite"):
        convert(photo_dir, url, to="wds", workers=0, storage_options=opts)
    assert objects(fs, url) == before
    # fewer, bigger shards: the old ones the new manifest does not list are removed
    convert(photo_dir, url, to="wds", workers=0, storage_options=opts, overwrite=True,
            writer_options={"shard_count": 40})
    after = objects(fs, url)
    assert set(after) == {MANIFEST_NAME, *(f["name"] for f in
                                            json.loads(after[MANIFEST_NAME])["files"])}
    assert "shard-000005.tar" in before and "shard-000005.tar" not in after
    assert verify(url, storage_options=opts).ok
    # an object feedpipe did not make: refused, with or without --overwrite, and left alone
    fs.pipe_file(url.removeprefix("s3://") + "/notes.txt", b"mine")
    for overwrite in (False, True):
        with pytest.raises(BadInputError, match="notes.txt"):
            convert(photo_dir, url, to="wds", workers=0, storage_options=opts,
                    overwrite=overwrite)
    assert objects(fs, url) == {**after, "notes.txt": b"mine"}


@pytest.mark.heavy
def test_killed_upload_leaves_no_manifest_and_a_rerun_resumes(tmp_path, photo_dir, s3):
    bucket, opts, fs = s3
    url = f"{bucket}/ds"
    cmd = [*CLI, "convert", str(photo_dir), "--to", "wds", "-o", url, "--shard-count", "1",
           "--workers", "0", "-q", *cli_opts(opts)]  # one shard per image: many uploads
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the journal says some shards are up
        try:  # moto replaces an object in place: a read may miss it for a moment
            journal = json.loads(fs.cat_file(f"{url.removeprefix('s3://')}/{JOURNAL}"))["files"]
        except (FileNotFoundError, ValueError):
            journal = {}
        if sum(e["state"] == "done" for e in journal.values()) >= 3:
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    held = objects(fs, url)
    assert MANIFEST_NAME not in held and JOURNAL in held
    with pytest.raises(BadInputError):
        read_manifest(url, opts)
    journal = json.loads(held[JOURNAL])["files"]
    uploaded = sorted(n for n, e in journal.items() if e["state"] == "done")
    assert len(uploaded) >= 3
    root = url.removeprefix("s3://")
    stamps = {n: fs.info(f"{root}/{n}")["LastModified"] for n in uploaded}
    time.sleep(1.1)  # S3 timestamps have whole seconds
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    fs.invalidate_cache()
    # the shards uploaded before the kill were not sent again
    assert {n: fs.info(f"{root}/{n}")["LastModified"] for n in uploaded} == stamps
    assert JOURNAL not in objects(fs, url)
    report = verify(url, storage_options=opts)
    assert report.ok and report.records_checked == len(list((photo_dir).rglob("*.jpg")))


def test_doctor_url_says_network_bound_behind_a_slow_link(photo_dir, s3, moto, capsys):
    bucket, opts, _ = s3
    url = f"{bucket}/ds"
    convert(photo_dir, url, to="wds", workers=0, storage_options=opts,
            writer_options={"shard_count": 10})
    proxy = FaultServer(upstream=moto.url)
    try:
        proxy.faults([{"kind": "throttle", "rate": 300e3}])  # 300 kB/s: ~30 photos/s
        slow = ["--storage-option", f"client_kwargs.endpoint_url={proxy.url}",
                "--storage-option", "key=testing", "--storage-option", "secret=testing"]
        rc, out, err = cli_main(capsys, "doctor", url, "--no-bench", "--json", *slow)
        assert rc == 0, err
        net = [f for f in json.loads(out)["findings"] if f["check"] == "network"]
        assert [f["severity"] for f in net] == ["high"], net
        assert net[0]["title"].startswith("network-bound") and "images/s" in net[0]["title"]
        assert proxy.fetched(".tar")  # the shards were fetched through the slow link
    finally:
        proxy.stop()


def test_run_doctor_takes_a_url_as_it_takes_a_folder(photo_dir, s3, tmp_path, monkeypatch):
    """One doctor entry point. A WebDataset URL gets the dataset, network and short
    bench findings; the bench reads through a private cache, never the user's."""
    bucket, opts, _ = s3
    monkeypatch.setenv("FEEDPIPE_CACHE", str(tmp_path / "user-cache"))
    convert(photo_dir, f"{bucket}/dw", to="wds", workers=0, storage_options=opts,
            writer_options={"shard_count": 4})
    convert(photo_dir, f"{bucket}/dl", to="lmdb", workers=0, storage_options=opts)
    rep = run_doctor(f"{bucket}/dw", batches=2, batch_size=8, size=32, env={},
                     storage_options=opts)
    checks = {f.check: f for f in rep.findings}
    assert rep.exit_code == 0 and rep.path == f"{bucket}/dw", rep.findings
    assert checks["network"].severity in ("ok", "high") and "MB/s" in checks["network"].title
    assert any("shards of" in f.title for f in rep.findings if f.check == "dataset")
    assert rep.bench is not None and rep.bench["trials"][rep.bench["best"]]["samples_per_s"] > 0
    assert checks["bench"].title.startswith("2 batches of 8")
    assert not (tmp_path / "user-cache").exists()
    lm = run_doctor(f"{bucket}/dl", batches=2, batch_size=8, size=32, env={},
                    storage_options=opts)
    found = {(f.check, f.severity): f.title for f in lm.findings}
    assert lm.bench is None and found["bench", "info"].startswith("no short bench: a lmdb dataset")
    assert "fetched whole" in found["network", "medium"]


def test_a_missing_bucket_is_named(photo_dir, s3, capsys):
    """A bucket that does not exist said 'not found while write the upload journal'."""
    bucket, opts, fs = s3
    url = f"{bucket}-missing/ds/"
    rc, _, err = cli_main(capsys, "convert", photo_dir, "--to", "lmdb", "-o", url, "-q",
                          *cli_opts(opts))
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{bucket}-missing: no such bucket" in err and "journal" not in err
