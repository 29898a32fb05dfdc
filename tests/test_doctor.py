"""feedpipe doctor: checks on simulated bad setups, real dataset facts, a clean run, exit codes."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from fp_helpers import cli_main

from converters import LabelColumns, convert
from feedpipe import Output, Workers
from feedpipe.errors import ConfigError
from feedpipe.loader.config import PREFETCH_DECODE
from feedpipe.loader.dali import pipeline as dali_pipeline
from feedpipe.loader.memory import ring_bytes, ring_slots
from feedpipe.schema.imaging import decoder_info
from feedpipe.tools import doctor, machine
from feedpipe.tools.doctor import (
    GiB,
    MiB,
    check_cores,
    check_dataset,
    check_decoder,
    check_gpu,
    check_pinned,
    check_shm,
    check_threads,
    dataset_facts,
    run_doctor,
)
from feedpipe.tools.monitor import LoaderInfo, StallSummary, advise

N = 72  # conftest.N_PHOTOS


def only(findings):
    assert len(findings) == 1, findings
    return findings[0]


def test_shm_tiny_medium_and_enough():
    batch = 64 * 224 * 224 * 3
    tiny = only(check_shm(64 * MiB, batch_size=64, size=224, workers=2))
    assert tiny.severity == "high" and "--shm-size=1g" in tiny.fix and "bus error" in tiny.title
    ring = ring_bytes(batch, 2, PREFETCH_DECODE)
    assert ring == ring_slots(2, PREFETCH_DECODE) * batch == 12 * batch
    mid = only(check_shm(8 * batch + 1, batch_size=64, size=224, workers=2))  # < 2 × ring
    assert mid.severity == "medium" and "slot ring" in mid.title and "shm-size" in mid.fix
    assert only(check_shm(2 * ring, batch_size=64, size=224, workers=2)).severity == "ok"
    assert only(check_shm(None, batch_size=64, size=224, workers=2)).severity == "high"
    assert only(check_shm(0, batch_size=64, size=224, workers=0)).severity == "ok"
    big = only(check_shm(MiB, batch_size=512, size=448, workers=16))
    assert f"--shm-size={-(-2 * ring_bytes(512 * 448 * 448 * 3, 16, 4) // GiB)}g" in big.fix


def test_cores_affinity_and_quota():
    assert only(check_cores(1, 8, None)).severity == "high"
    part = only(check_cores(4, 8, None))
    assert part.severity == "medium" and "4 of the machine's 8" in part.title
    assert "2.0x" in part.gain
    quota = only(check_cores(8, 8, 2.0))
    assert quota.severity == "medium" and "num_workers=2" in quota.fix
    assert only(check_cores(8, 8, None)).severity == "ok"
    assert only(check_cores(8, 8, 7.8)).severity == "ok"


def test_cgroup_quota_and_fs_type_from_files(tmp_path):
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir()
    (v2 / "cpu.max").write_text("250000 100000\n")
    assert machine.cgroup_cpu_limit(v2) == 2.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert machine.cgroup_cpu_limit(v2) is None
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert machine.cgroup_cpu_limit(v1) == 1.5
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert machine.cgroup_cpu_limit(v1) is None
    assert machine.cgroup_cpu_limit(tmp_path / "none") is None
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/a / ext4 rw 0 0\nsrv:/x {tmp_path} nfs4 rw 0 0\n"
                      f"tmpfs {tmp_path}/ram tmpfs rw 0 0\n")
    assert machine.fs_type(tmp_path / "data", mounts) == "nfs4"
    assert machine.fs_type(tmp_path / "ram" / "x", mounts) == "tmpfs"
    assert machine.fs_type("/usr", mounts) == "ext4"


def test_decoder():
    slow = only(check_decoder({"jpeg_loader_path": "pillow", "jpeg_decoder": "pillow",
                               "pil": "pillow", "pil_version": "10.0"}))
    assert slow.severity == "medium" and "simplejpeg" in slow.fix
    fast = only(check_decoder({"jpeg_loader_path": "simplejpeg+torch",
                               "jpeg_decoder": "simplejpeg"}))
    assert fast.severity == "ok"


def test_gpu_dali_and_pinned():
    assert only(check_gpu(False, [], None)).severity == "info"
    no_dali = only(check_gpu(True, ["H100"], None))
    assert no_dali.severity == "low" and "nvidia-dali" in no_dali.fix
    for cuda, wheel in (("11.8", "nvidia-dali-cuda120"), ("12.4", "nvidia-dali-cuda120"),
                        ("13.0", "nvidia-dali-cuda130")):  # the wheel of torch's CUDA build
        fix = only(check_gpu(True, ["H100"], None, cuda)).fix
        assert f"pip install {wheel} " in fix and f"for CUDA {cuda} (torch.version.cuda)" in fix
    assert only(check_gpu(True, ["H100"], "2.4.0")).severity == "ok"
    assert check_pinned(False, None) == []
    bad = only(check_pinned(True, "CUDA error: out of memory"))
    assert bad.severity == "high" and "memlock" in bad.fix and "out of memory" in bad.title
    assert only(check_pinned(True, None)).severity == "ok"


def test_doctor_and_stallmeter_give_one_dali_hint(monkeypatch):
    """The DALI hint is decided once: doctor's gpu fix and StallMeter's advice are that text."""
    monkeypatch.setattr(dali_pipeline, "DALI_MODULE", "nvidia.no_such_dali")  # not installed
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    fix = only(check_gpu(True, ["H100"], None, "12.4")).fix
    summary = StallSummary(100, 3200, 10.0, 0.1, 6.0, 4.0, 0.6, 50.0, 60.0, 70.0, 320.0,
                           "input-bound", ())
    advice = advise(summary, LoaderInfo(num_workers=8, usable_cores=8, codec="jpeg",
                                        format="lmdb", device="cuda"))
    assert fix in advice and "backend='dali'" in fix and "nvidia-dali-cuda120" in fix


def test_threads_oversubscription():
    omp = check_threads({"OMP_NUM_THREADS": "64"}, 1, 8, 7)
    assert [f.severity for f in omp] == ["medium"] and "OMP_NUM_THREADS=1" in omp[0].fix
    cpu = only(check_threads({}, 8, 8, 8))
    assert cpu.severity == "low" and "set_num_threads(1)" in cpu.fix
    assert only(check_threads({}, 8, 8, 8, cuda=True)).severity == "info"
    assert only(check_threads({"OMP_NUM_THREADS": "1"}, 1, 8, 7)).severity == "ok"


def test_loose_files_are_the_top_finding(photo_dir):
    facts = dataset_facts(photo_dir)
    assert (facts.kind, facts.samples, facts.files) == ("folder", N, N)
    assert facts.total_bytes == sum(p.stat().st_size for p in photo_dir.rglob("*.jpg"))
    f = only(check_dataset(facts))
    assert f.severity == "high" and "loose image files" in f.title
    assert f"feedpipe convert {photo_dir} --to lmdb" in f.fix


def test_the_loose_files_fix_runs_as_written(photo_dir, tmp_path, monkeypatch, capsys):
    """The suggested convert command, then the suggested make_loader call, as printed: the call
    used to lack a batch size and size= (variable-size photos cannot be batched without one)."""
    import feedpipe

    fix = only(check_dataset(dataset_facts(photo_dir), size=32)).fix
    command, call = re.fullmatch(r"feedpipe (convert .*?) \(.*\), then (feedpipe\.make_loader"
                                 r"\(.*\))", fix).groups()
    monkeypatch.chdir(tmp_path)
    rc, _, err = cli_main(capsys, *command.split(), "-q")
    assert rc == 0, err
    loader = eval(call, {"feedpipe": feedpipe})  # noqa: S307 - the text doctor prints
    batch = next(iter(loader))
    assert batch["image"].shape[1:] == (3, 32, 32) and len(batch["label"]) == N


def test_encoded_vs_raw(packed, photo_dir, tmp_path):
    enc = dataset_facts(packed["lmdb"])
    assert (enc.kind, enc.format, enc.codec, enc.samples) == ("packed", "lmdb", "jpeg", N)
    fits = only(check_dataset(dataclasses.replace(enc, ram_bytes=16 * GiB)))
    assert fits.severity == "low" and "--store raw --resize 224" in fits.fix
    assert only(check_dataset(dataclasses.replace(enc, ram_bytes=MiB))).severity == "info"
    convert(photo_dir, tmp_path / "raw", to="lmdb", store="raw", resize=32, workers=0)
    raw = dataset_facts(tmp_path / "raw")
    assert raw.codec == "raw"
    assert only(check_dataset(dataclasses.replace(raw, ram_bytes=16 * GiB))).severity == "ok"
    big = only(check_dataset(dataclasses.replace(raw, ram_bytes=raw.total_bytes)))
    assert big.severity == "medium" and "RAM" in big.title


def test_doctor_counts_the_workers_the_loader_starts(photo_dir, tmp_path, monkeypatch):
    """Raw images are not decoded, so num_workers='auto' starts 2 workers, not one per core:
    doctor's quota and thread checks reason about those 2 (on a simulated 16-core machine)."""
    convert(photo_dir, tmp_path / "raw", to="lmdb", store="raw", resize=32, workers=0)
    real = machine.describe()
    monkeypatch.setattr(doctor.machine, "describe", lambda: {
        **real, "cores_usable": 16, "cores_machine": 16, "cgroup_cpu_limit": 4.0,
        "torch_threads": 1})
    rep = run_doctor(tmp_path / "raw", bench=False, env={})
    by = {f.check: f for f in rep.findings}
    assert by["cores"].severity == "ok"  # a quota of 4 cores holds the loader's 2 workers
    assert by["threads"].title == "torch threads 1, 2 workers on 16 cores"


def test_no_raw_advice_where_convert_refuses_it(photo_dir, tmp_path):
    """A dataset with keypoints or boxes: `--store raw --resize` is refused by convert (their
    coordinates refer to the source images), so doctor names why instead of advising it."""
    (tmp_path / "img").mkdir()
    for p in sorted(photo_dir.rglob("*.jpg"))[:8]:
        shutil.copy(p, tmp_path / "img" / f"{p.parent.name}-{p.name}")
    manifest = tmp_path / "kp.jsonl"
    manifest.write_text("".join(json.dumps({"path": f"img/{p.name}", "kp": [[10, 12], [40, 30]]})
                                + "\n" for p in sorted((tmp_path / "img").iterdir())))
    convert(manifest, tmp_path / "kp", to="lmdb", workers=0,
            columns=LabelColumns(keypoints="kp"))
    facts = dataclasses.replace(dataset_facts(tmp_path / "kp"), ram_bytes=16 * GiB)
    found = only(check_dataset(facts))
    assert "--store raw" not in found.fix + found.title and "--resize" in found.title
    assert "kp" in found.title and found.severity == "info" and facts.codec == "jpeg"
    with pytest.raises(ConfigError, match="resize"):  # what that advice would have met
        convert(manifest, tmp_path / "raw", to="lmdb", workers=0, store="raw", resize=32,
                columns=LabelColumns(keypoints="kp"))


def test_a_time_series_gets_no_image_advice(tmp_path, capsys):
    """No image field: no JPEG decoder check, no "None images", no image bench (it would refuse
    the dataset and fail the run); the rest of the checks run and the run exits 0."""
    rows = "".join(f"{k * 0.5},{k % 7},{-k}\n" for k in range(200))
    (tmp_path / "s.csv").write_text("a,b,c\n" + rows)
    rc, _, err = cli_main(capsys, "convert", tmp_path / "s.csv", "--columns", "a,b,c",
                          "--dtype", "float32", "--series", "--to", "lmdb", "-o",
                          tmp_path / "ts", "-q")
    assert rc == 0, err
    rep = run_doctor(tmp_path / "ts", batches=2, batch_size=16, size=64, env={})
    assert rep.exit_code == 0 and not any(f.severity == "error" for f in rep.findings)
    checks = {f.check for f in rep.findings}
    assert "decoder" not in checks and {"cores", "shm", "dataset", "bench"} <= checks
    text = " ".join(f"{f.title} {f.fix}" for f in rep.findings)
    assert "None" not in text and "JPEG" not in text and "--store raw" not in text
    assert "ring" not in only([f for f in rep.findings if f.check == "shm"]).title  # (no ring)
    assert only(check_shm(None, batch_size=16, size=64, workers=2, images=False)).severity == \
        "high"
    assert only([f for f in rep.findings if f.check == "dataset"]).title.endswith(
        "no images, 0.00 GiB")
    bench = only([f for f in rep.findings if f.check == "bench"])
    assert bench.severity == "info" and "StallMeter" in bench.fix and rep.bench is None
    assert "loading scales" in only(check_cores(1, 4, None, images=False)).gain


def test_hdf5_compression_small_shards_network_fs(packed, photo_dir, tmp_path):
    convert(photo_dir, tmp_path / "gz", to="hdf5", workers=0,
            writer_options={"compression": "gzip"})
    gz = check_dataset(dataset_facts(tmp_path / "gz"))
    assert any(f.severity == "medium" and "gzip" in f.title for f in gz)
    wds = check_dataset(dataset_facts(packed["wds"]))
    shards = [f for f in wds if "shards" in f.title]
    assert len(shards) == 1 and "--shard-size" in shards[0].fix
    nfs = check_dataset(dataclasses.replace(dataset_facts(packed["lmdb"]), fs_type="nfs4"))
    assert any(f.severity == "medium" and "nfs4" in f.title for f in nfs)


def test_clean_run_on_a_packed_dataset(packed):
    rep = run_doctor(packed["lmdb"], batches=2, batch_size=16, size=64, env={})
    checks = {f.check for f in rep.findings}
    assert {"cores", "shm", "decoder", "gpu", "threads", "dataset", "bench"} <= checks
    assert rep.exit_code == 0 and not any(f.severity == "error" for f in rep.findings)
    assert [doctor.RANK[f.severity] for f in rep.findings] == \
        sorted(doctor.RANK[f.severity] for f in rep.findings)
    assert only([f for f in rep.findings if f.check == "dataset"]).severity in ("low", "info")
    bench = only([f for f in rep.findings if f.check == "bench"])
    speedup, tuned = rep.bench["speedup_vs_baseline"], rep.bench["speedup_vs_tuned"]
    assert f"{speedup:.1f}x a default DataLoader (workers=0, PIL) and {tuned:.2f}x a tuned " \
           "one (" in bench.title
    assert rep.bench["trials"][0]["batches"] == 2


def test_loose_folder_run_packs_a_sample(photo_dir):
    rep = run_doctor(photo_dir, batches=2, batch_size=16, size=64, env={})
    assert rep.findings[0].check == "dataset" and rep.findings[0].severity == "high"
    assert rep.bench["dataset"]["samples"] == 32  # batches × batch size of the images
    assert "temporary LMDB" in only([f for f in rep.findings if f.check == "bench"]).title
    # the gain of packing, measured by that bench on this machine, not a figure from elsewhere
    speedup, tuned = rep.bench["speedup_vs_baseline"], rep.bench["speedup_vs_tuned"]
    workers = rep.bench["tuned_baseline"]["workers"]
    assert rep.findings[0].gain == (
        f"{speedup:.1f}x a default DataLoader (workers=0, PIL) and {tuned:.2f}x a tuned one "
        f"({workers} workers, persistent, prefetch 4) on the loose files, in this run, measured "
        "by the short bench")


def test_gains_carry_no_figures_from_another_machine(photo_dir, packed):
    """Gains are computed from this machine's inputs, measured here, or name the command."""
    gains = [f.gain for f in (
        check_decoder({"jpeg_loader_path": "pillow", "jpeg_decoder": "pillow"})
        + check_dataset(dataset_facts(photo_dir))
        + check_dataset(dataclasses.replace(dataset_facts(packed["lmdb"]), ram_bytes=16 * GiB))
        + check_shm(8 * 64 * 224 * 224 * 3 + 1, batch_size=64, size=224, workers=2))]
    assert all(gains) and len(gains) == 4
    assert "feedpipe bench" in gains[0] and "feedpipe bench PATH --baseline" in gains[1]
    assert "feedpipe bench" in gains[2]
    assert gains[3] == f"no page faults on {64 * 224 * 224 * 3 / MiB:,.0f} MiB of fresh " \
                       "shared memory per batch"
    for gain in gains[:3]:
        assert not any(c.isdigit() for c in gain) and "2-core" not in gain, gain
    no_bench = run_doctor(photo_dir, bench=False, env={})
    assert only([f for f in no_bench.findings if f.check == "dataset"]).gain == gains[1]


def test_failing_check_is_reported_and_exits_1(packed, copy_dataset, capsys):
    damaged = copy_dataset(packed["wds"], "damaged")
    for shard in damaged.glob("shard-*.tar"):
        shard.write_bytes(b"\0" * shard.stat().st_size)  # same size, contents gone
    rep = run_doctor(damaged, batches=2, batch_size=16, size=64, env={})
    err = only([f for f in rep.findings if f.severity == "error"])
    assert err.check == "bench" and rep.exit_code == 1
    assert rep.findings[0] is err and rep.bench is None
    rc, out, _ = cli_main(capsys, "doctor", damaged, "--batches", "2", "--batch-size", "16",
                          "--size", "64")
    assert rc == 1 and "[ERROR] bench" in out


def test_cli_json_and_exit_codes(tmp_path, capsys):
    rc, out, _ = cli_main(capsys, "doctor", "--json")
    d = json.loads(out)
    assert rc == 0 == d["exit_code"] and d["schema_version"] == 1 and d["path"] is None
    assert {f["check"] for f in d["findings"]} >= {"cores", "shm", "decoder", "gpu", "threads"}
    assert d["machine"]["cores_usable"] == machine.usable_cores()
    rc, _, err = cli_main(capsys, "doctor", tmp_path / "nope")
    assert rc == 2 and "nope" in err
    (tmp_path / "empty").mkdir()
    rc, _, err = cli_main(capsys, "doctor", tmp_path / "empty", "--no-bench")
    assert rc == 2 and "neither a packed feedpipe dataset" in err


def test_bad_options_exit_2_before_any_check(packed, capsys):
    with pytest.raises(ConfigError, match=r"^batches=1: use an integer of at least 2") as exc:
        run_doctor(packed["lmdb"], batches=1)
    assert exc.value.option == "batches"
    with pytest.raises(ConfigError, match=r"^batch_size='64': use an integer") as exc:
        run_doctor(None, batch_size="64")  # type: ignore[arg-type]
    assert exc.value.option == "batch_size"
    rc, out, err = cli_main(capsys, "doctor", packed["lmdb"], "--size", "0")
    assert rc == 2 and "--size 0: use an integer" in err and "size=" not in err and out == ""


def test_cli_text_output(packed, capsys):
    rc, out, _ = cli_main(capsys, "doctor", Path(packed["lmdb"]), "--no-bench")
    assert rc == 0 and out.startswith("feedpipe doctor: ")
    assert str(only(check_decoder(decoder_info()))) in out  # this machine's decoder verdict
    assert "bench" not in {line.split("]")[1].split(":")[0].strip()
                           for line in out.splitlines() if line.startswith("[")}


def test_ring_bytes_are_one_arithmetic_for_the_loader_doctor_and_tune(packed):
    """The slot ring's size comes from feedpipe.loader.memory everywhere: the ring a real loader
    allocates, doctor's /dev/shm estimate and tune's RAM estimate."""
    import feedpipe
    from feedpipe.loader.memory import FEED_DEPTH, shm_wanted

    ld = feedpipe.make_loader(packed["lmdb"], 8, size=32, num_workers=2, device="cpu",
                              workers=Workers(prefetch_factor=3), output=Output(dtype="uint8"))
    next(iter(ld))
    ring = ld.ring
    assert ring is not None and ring.count == ring_slots(2, 3) == 2 * 3 + FEED_DEPTH + 2
    allocated = sum(t.untyped_storage().nbytes() for ts in ring.tensors.values() for t in ts)
    per_batch = allocated // ring.count
    assert allocated == ring_bytes(per_batch, 2, 3) == ring.nbytes
    image = 64 * 224 * 224 * 3
    mid = only(check_shm(shm_wanted(ring_bytes(image, 2, 4)) - 1, batch_size=64, size=224,
                         workers=2))
    assert mid.severity == "medium"  # doctor's headroom is the loader's: one byte short
    assert only(check_shm(shm_wanted(ring_bytes(image, 2, 4)), batch_size=64, size=224,
                          workers=2)).severity == "ok"
    # in-process: the ring of the batch being made, those kept ready and the one in use
    assert ring_bytes(1600, 0, 3) == ring_bytes(1600, 0, 0) == 1600 * (FEED_DEPTH + 2)
