"""feedpipe bench: trial figures and their consistency, JSON schema, baseline, plot, CLI."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
from pathlib import Path

import pytest
from fp_helpers import cli_main
from PIL import Image

from converters import convert
from feedpipe.dataset.registry import open_dataset
from feedpipe.errors import ConfigError, MissingDependencyError
from feedpipe.loader.config import auto_workers, usable_cores
from feedpipe.paths import write_atomic
from feedpipe.tools import machine
from feedpipe.tools.bench import BenchConfig, run_bench, sweep_workers
from feedpipe.tools.benchreport import SCHEMA_VERSION, format_table, plot_report

N = 72                      # conftest.N_PHOTOS
FAST = dict(batch_sizes=(16,), size=64, batches=4)
TRIAL_KEYS = {"format", "backend", "batch_size", "workers_requested", "workers", "prefetch",
              "status", "reason", "ram_bytes",
              "samples", "batches", "wall_s", "first_batch_s", "samples_per_s",
              "bytes_per_sample", "mb_per_s", "wait_fraction", "wait_p50_ms", "wait_p95_ms",
              "wait_p99_ms", "peak_rss_main_mb", "peak_rss_workers_mb", "cpu_util", "stall",
              "best", "source"}


@pytest.fixture(scope="module")
def report(packed):
    """One sweep on the test run's LMDB: workers 0 and 2, plus the baseline on the loose files."""
    return run_bench(packed["lmdb"], BenchConfig(workers=(0, 2), baseline=True, **FAST))


def test_trials_figures_are_consistent(report, packed):
    assert [t.workers for t in report.trials] == [0, 2]
    reader = open_dataset(packed["lmdb"])
    per_sample = sum(f.size for f in reader.manifest.files) / len(reader)
    for t in report.trials:
        s = t.stall
        assert (t.status, t.batches, t.samples) == ("ok", 4, 64)
        waits, steps, warm = s["waits_s"], s["steps_s"], max(1, t.workers)
        assert s["rows"] == [16] * 4 and s["throughput"]["warmup_batches"] == warm
        # arrival to arrival after the warm-up batches, one window per batch: the median
        spans = sorted(steps[i - 1] + waits[i] for i in range(warm, 4))
        assert t.samples_per_s == pytest.approx(statistics.median([16 / x for x in spans]))
        assert t.bytes_per_sample == pytest.approx(per_sample)
        assert t.mb_per_s == pytest.approx(t.samples_per_s * per_sample / 1e6)
        wait_after = sum(waits[warm:])
        assert t.wait_fraction == pytest.approx(wait_after / (wait_after + sum(steps[warm - 1:3])))
        assert t.first_batch_s == s["first_batch_s"] == waits[0] > 0
        assert 0 <= t.wait_p50_ms <= t.wait_p95_ms <= t.wait_p99_ms
        assert t.peak_rss_main_mb > 0
        # CPU time cannot exceed wall time × usable cores, up to the kernel's 10 ms accounting
        # ticks (one per process: main + 2 workers) on a sub-second trial
        slack = 3 * 0.01 / (t.wall_s * usable_cores())
        assert 0 < t.cpu_util <= 1.02 + slack, (t.cpu_util, t.wall_s)
    w0, w2 = report.trials
    assert w0.peak_rss_workers_mb == 0 < w2.peak_rss_workers_mb  # only real workers count
    best = max(report.trials, key=lambda t: t.samples_per_s)
    assert [t.best for t in report.trials] == [t is best for t in report.trials]


def test_baseline_reads_loose_files_and_gives_ratio(report, photo_dir):
    base = report.baseline
    assert base is not None and base.source == "loose files" and base.workers == 0
    assert (base.backend, base.batches, base.samples) == ("DataLoader", 4, 64)
    sizes = [p.stat().st_size for p in photo_dir.rglob("*.jpg")]
    assert min(sizes) <= base.bytes_per_sample <= max(sizes)
    assert report.speedup == pytest.approx(report.best.samples_per_s / base.samples_per_s)
    text = format_table(report)
    assert f"{report.speedup:.1f}x a default DataLoader (workers=0, PIL)" in text
    assert sum(line.startswith("* ") for line in text.splitlines()) == 1


def test_the_ratio_names_the_tuned_dataloader_too(report):
    """The ratio against workers=0 stands in one line with the ratio against the tuned
    DataLoader (its workers, persistent, prefetch 4), measured in the same run on the same files,
    so it cannot be read as the gain over a tuned DataLoader."""
    tuned = report.tuned
    assert tuned is not None and tuned.source == "loose files" and tuned.batches == 4
    assert tuned.workers == auto_workers(True) >= 1 and tuned.backend == "DataLoader"
    assert report.speedup_vs_tuned == pytest.approx(report.best.samples_per_s
                                                    / tuned.samples_per_s)
    [line] = [ln for ln in format_table(report).splitlines() if "a default DataLoader" in ln]
    assert f"{report.speedup:.1f}x a default DataLoader (workers=0, PIL) and " \
           f"{report.speedup_vs_tuned:.2f}x a tuned one ({tuned.workers} workers, persistent, " \
           "prefetch 4) on the loose files, in this run" in line
    d = report.to_json()
    assert d["tuned_baseline"]["workers"] == tuned.workers
    assert d["speedup_vs_tuned"] == report.speedup_vs_tuned


def test_json_schema(report, tmp_path):
    d = json.loads(json.dumps(report.to_json()))  # plain JSON types only
    assert d["schema_version"] == SCHEMA_VERSION == 1
    assert {"feedpipe_version", "created", "machine", "config", "dataset", "trials", "baseline",
            "best", "speedup_vs_baseline"} <= set(d)
    assert all(set(t) == TRIAL_KEYS for t in d["trials"] + [d["baseline"], d["tuned_baseline"]])
    assert d["trials"][d["best"]]["best"] is True
    assert d["config"]["workers"] == [0, 2] and d["config"]["batches"] == 4
    assert d["dataset"] == {"path": str(report.dataset["path"]), "kind": "packed",
                            "format": "lmdb", "samples": N, "codec": "jpeg"}
    m = d["machine"]
    assert m["cores_usable"] == machine.usable_cores()
    assert {"cpu_model", "memory", "shm", "gpus", "libraries", "decoders"} <= set(m)
    assert m["libraries"]["torch"] and m["decoders"]["jpeg_decoder"]


def test_plot_is_a_png(report, tmp_path):
    out = plot_report(report, tmp_path / "bench.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(out) as img:
        assert img.format == "PNG" and img.width > 400 and img.height > 300


def test_plot_without_matplotlib_says_how_to_install(report, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    with pytest.raises(MissingDependencyError, match=r"feedpipe\[plot\]"):
        plot_report(report, tmp_path / "x.png")


def test_step_wait_fraction_matches_meter(packed):
    for kind in ("sleep", "busy"):
        r = run_bench(packed["hdf5"], BenchConfig(workers=(0,), step_ms=5, step_kind=kind, **FAST))
        t = r.trials[0]
        s = t.stall
        assert 0 < t.wait_fraction < 1
        w = s["waits_s"]  # workers=0: one warm-up batch; the steps between arrivals count
        assert t.wait_fraction == pytest.approx(sum(w[1:]) / (sum(w[1:]) + sum(s["steps_s"][:3])))
        assert sum(s["steps_s"]) >= 4 * 0.005  # four steps, each at least the 5 ms asked for
        # the meter's steady state is bench's: the steps between post-warm-up arrivals
        assert s["step_s"] == pytest.approx(sum(s["steps_s"][:3]))
        assert "simulated 5 ms training step" in format_table(r)


def test_epochs_read_every_sample(packed):
    r = run_bench(packed["wds"], BenchConfig(workers=(0,), batch_sizes=(16,), size=64,
                                             batches=None, epochs=1))
    t = r.trials[0]
    assert (t.samples, t.batches) == (N, math.ceil(N / 16))


def test_auto_merges_with_its_value(packed):
    auto = auto_workers(True)
    r = run_bench(packed["lmdb"], BenchConfig(workers=(auto, "auto"), **FAST))
    assert [(t.workers, t.workers_requested) for t in r.trials] == [(auto, f"{auto} (auto)")]


def test_dali_row_is_measured_or_marked_unavailable(packed):
    r = run_bench(packed["lmdb"], BenchConfig(backends=("torch", "dali"), workers=(0,), **FAST))
    torch_row, dali = r.trials
    assert torch_row.backend == "torch" and torch_row.status == "ok"
    assert dali.backend == "dali"
    if dali.status == "unavailable":
        assert dali.reason and dali.workers is None and not dali.best
        assert f"unavailable: {dali.reason}" in format_table(r)
    else:
        assert dali.samples == 64


def test_folder_is_packed_per_format_then_removed(photo_dir):
    r = run_bench(photo_dir, BenchConfig(workers=(0,), limit=40, formats=("lmdb", "wds"),
                                         baseline=True, **FAST))
    assert r.dataset["kind"] == "folder" and r.dataset["samples"] == 40
    assert [t.format for t in r.trials] == ["lmdb", "wds"]
    for info in r.dataset["packed"].values():
        assert info["images"] == 40 and info["kept"] is False
        assert not Path(info["path"]).exists()
    assert r.baseline.source == "loose files"


def test_folder_pack_dir_is_kept(photo_dir, tmp_path):
    r = run_bench(photo_dir, BenchConfig(workers=(0,), limit=20, pack_dir=tmp_path / "keep",
                                         **FAST))
    assert r.dataset["packed"]["lmdb"]["kept"] is True
    assert len(open_dataset(tmp_path / "keep" / "lmdb")) == 20


def test_baseline_decodes_packed_bytes_when_the_files_are_gone(photo_dir, tmp_path):
    src = shutil.copytree(photo_dir, tmp_path / "src")
    convert(src, tmp_path / "packed", to="lmdb", workers=0)
    shutil.rmtree(src)
    r = run_bench(tmp_path / "packed", BenchConfig(workers=(0,), baseline=True, **FAST))
    assert r.baseline.source == "packed bytes" and r.baseline.samples == 64
    assert "default DataLoader on packed bytes" in format_table(r)


def test_sweep_workers():
    assert sweep_workers(1) == (0, 1)
    assert sweep_workers(2) == (0, 1, 2)
    assert sweep_workers(6) == (0, 1, 2, 4, 6)
    assert sweep_workers(16) == (0, 1, 2, 4, 8, 16)


@pytest.mark.parametrize("bad, match", [
    (dict(batches=1), "at least 2"),
    (dict(batches=5, epochs=1), "not both"),
    (dict(workers=(-1,)), "workers"),
    (dict(backends=("tensorflow",)), "torch and/or dali"),
    (dict(formats=("zip",)), "lmdb, hdf5"),
    (dict(step_ms=-1), "step_ms"),
    (dict(limit=0), "limit"),
    (dict(batches=2.5), r"batches=2\.5: use an integer"),
    (dict(size="224"), r"size='224': use an integer"),
    (dict(threads=0), "threads=0"),
    (dict(seed=-1), "seed=-1"),
    (dict(step_ms=float("nan")), "step_ms=nan"),
    (dict(dtype="float64"), "dtype='float64': use one of float32"),
    (dict(formats="lmdb"), r"formats='lmdb': pass a tuple"),
    (dict(batch_sizes=(True,)), "batch_sizes"),
])
def test_bad_config_says_how_to_fix(bad, match):
    with pytest.raises(ConfigError, match=match):
        BenchConfig(**bad)


def test_run_bench_wants_a_config(packed):
    with pytest.raises(ConfigError, match=r"pass a feedpipe\.tools\.bench\.BenchConfig"):
        run_bench(packed["lmdb"], {"batches": 4})  # type: ignore[arg-type]


def test_write_atomic_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    write_atomic(out, b"old")
    write_atomic(out, "néw")  # text is written as UTF-8
    assert out.read_bytes() == "néw".encode()

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", disk_full)  # fails after the bytes went to the temp file
    with pytest.raises(OSError, match="No space"):
        write_atomic(out, b"half")
    monkeypatch.undo()
    assert out.read_bytes() == "néw".encode()
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_cli_writes_json_and_plot(packed, tmp_path, capsys):
    rc, out, err = cli_main(capsys, "bench", packed["lmdb"], "--workers", "0", "--batches", "3",
                            "--batch-size", "16", "--size", "64", "--baseline", "-q",
                            "--json", tmp_path / "b.json", "--plot", tmp_path / "b.png")
    assert rc == 0, err
    d = json.loads((tmp_path / "b.json").read_text())
    assert d["schema_version"] == 1 and d["trials"][0]["batches"] == 3
    assert f"{d['speedup_vs_baseline']:.1f}x a default DataLoader (workers=0, PIL) and " \
           f"{d['speedup_vs_tuned']:.2f}x a tuned one" in out
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "b.png"]  # no temp files


@pytest.mark.parametrize("option, where, match", [
    ("--json", "no-such-dir/b.json", "no-such-dir does not exist"),
    ("--plot", ".", "is a folder"),
])
def test_cli_bad_output_path_fails_before_the_run(packed, tmp_path, capsys, option, where, match):
    rc, out, err = cli_main(capsys, "bench", packed["lmdb"], "--workers", "0", "--batches", "2",
                            "-q", option, tmp_path / where)
    assert rc == 2 and f"{option} " in err and match in err
    assert out == ""  # no table: nothing ran


def test_cli_plot_without_matplotlib_fails_before_the_run(packed, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    rc, out, err = cli_main(capsys, "bench", packed["lmdb"], "--workers", "0", "--batches", "2",
                            "-q", "--json", tmp_path / "b.json", "--plot", tmp_path / "b.png")
    assert rc == 2 and "feedpipe[plot]" in err and out == ""
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("args, match", [
    (["--workers", "0,two"], "--workers"),
    (["--batch-size", "x"], "--batch-size"),
])
def test_cli_bad_options_exit_2(packed, capsys, args, match):
    rc, out, err = cli_main(capsys, "bench", packed["lmdb"], *args)
    assert rc == 2 and match in err


def test_cli_bad_path_exit_2(tmp_path, capsys):
    rc, _, err = cli_main(capsys, "bench", tmp_path / "missing")
    assert rc == 2 and "missing" in err
    (tmp_path / "empty").mkdir()
    rc, _, err = cli_main(capsys, "bench", tmp_path / "empty")
    assert rc == 2 and "neither a packed feedpipe dataset" in err


def test_cli_reports_unreadable_images_of_a_folder(photo_dir, tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(photo_dir, src)
    bad = sorted(src.rglob("*.jpg"))[3]
    bad.write_bytes(bad.read_bytes()[:400])  # truncated: skipped at packing, and said so
    code, out, _ = cli_main(capsys, "bench", src, "--workers", "0", "--batches", "2",
                            "--batch-size", "4", "--size", "32", "--device", "cpu", "-q")
    assert code == 0
    rel = bad.relative_to(src).as_posix()
    assert f"skipped 1 unreadable input(s), not benchmarked; first: {rel}: truncated JPEG" in out
