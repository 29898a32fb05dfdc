"""The one samples/s definition (feedpipe.tools.throughput) that StallMeter's summary, bench, tune,
the benchmark harness and the peers harness share."""

from __future__ import annotations

import importlib
import statistics

import pytest

from feedpipe.errors import ConfigError
from feedpipe.tools import throughput as tp
from feedpipe.tools.bench import BenchConfig, run_bench
from feedpipe.tools.monitor import StallMeter, time_epoch

bench_mod = importlib.import_module("feedpipe.tools.bench")
autotune_mod = importlib.import_module("feedpipe.tools.tune.autotune")


def test_bench_and_tune_rate_their_trials_with_the_one_function(packed, monkeypatch):
    seen = []
    real = tp.of_meter

    def spy(meter, workers):  # the real function, recording what it was given and gave back
        th = real(meter, workers)
        seen.append((list(meter.waits), list(meter.steps), list(meter.rows), workers, th))
        return th

    monkeypatch.setattr(bench_mod, "of_meter", spy)
    monkeypatch.setattr(autotune_mod, "of_meter", spy)
    bench = run_bench(packed["lmdb"], BenchConfig(workers=(0,), batch_sizes=(16,), size=64,
                                                  batches=6)).trials[0]
    tune = autotune_mod.measure(packed["lmdb"], 16, 0, None, trial_batches=5, size=64,
                                crop="center_crop")
    assert len(seen) == 2
    assert type(bench) is type(tune) is tp.Trial  # one record for both
    assert (bench.format, bench.backend, bench.workers) == (tune.format, tune.backend, 0)
    bth, tth = seen[0][-1], seen[1][-1]
    assert bench.samples_per_s == bth.samples_per_s > 0
    assert tune.samples_per_s == tth.samples_per_s > 0
    assert bench.first_batch_s == seen[0][0][0] and tune.first_batch_s == seen[1][0][0]
    # same trial shape (6 batches, in-process): the same warm-up and windows, and each rate is
    # the definition applied to that trial's own timings
    assert (bth.batches, bth.warmup_batches, bth.windows) == (tth.batches, tth.warmup_batches,
                                                              tth.windows) == (6, 1, 3)
    for waits, steps, rows, workers, th in seen:
        assert tp.throughput(waits, steps, rows, workers) == th
        spans = [steps[i - 1] + waits[i] for i in range(1, 6)]  # arrival to arrival
        assert th.samples_per_s == pytest.approx(statistics.median(
            [sum(rows[a + 1:b + 1]) / sum(spans[a:b]) for a, b in ((0, 2), (2, 3), (3, 5))]))


def test_warmup_excludes_startup_and_short_runs_keep_one_window():
    waits, steps, rows = [5.0, 0.0, 0.1, 0.1, 0.1], [0.1] * 5, [8] * 5
    th = tp.throughput(waits, steps, rows, workers=2)  # batch 1 arrived with batch 0
    assert (th.warmup_batches, th.windows, th.first_batch_s) == (2, 3, 5.0)
    assert th.samples_per_s == pytest.approx(8 / 0.2)
    assert th.wait_fraction == pytest.approx(0.5)
    # the whole pass, start-up included: 40 samples from the first ask to the last arrival
    # (5.3 s of waits and the 0.4 s of steps between arrivals)
    assert (th.epoch_s, th.epoch_samples_per_s) == (pytest.approx(5.7), pytest.approx(40 / 5.7))
    assert th.epoch_samples_per_s == pytest.approx(tp.steady_rate(waits, steps, rows, 0, 1))
    assert (th.wait_s, th.step_s) == (pytest.approx(0.3), pytest.approx(0.3))
    short = tp.throughput([5.0, 0.1], [0.1, 0.1], [8, 8], workers=4)
    assert (short.warmup_batches, short.windows) == (1, 1)
    assert short.samples_per_s == pytest.approx(8 / 0.2)
    with pytest.raises(ConfigError, match="at least 2"):
        tp.throughput([5.0], [0.1], [8], workers=0)


def test_time_epoch_reads_the_loaders_workers(packed):
    import feedpipe

    loader = feedpipe.make_loader(packed["lmdb"], 16, size=64, num_workers=2, crop="center_crop")
    th = time_epoch(loader)
    assert th.warmup_batches == 2 and th.samples == 72 and th.samples_per_s > 0


def test_monitor_and_bench_agree_on_one_runs_timings(packed):
    """``feedpipe bench`` keeps its meter's summary (what StallMeter reports in a training run)
    beside its own figures: on the same batches they are the same figures."""
    trial = run_bench(packed["lmdb"], BenchConfig(workers=(2,), batch_sizes=(8,), size=64,
                                                  batches=8)).trials[0]
    monitor, bench = trial.stall, trial.stall["throughput"]
    assert trial.samples_per_s == bench["samples_per_s"] == monitor["samples_per_s"] > 0
    assert monitor["warmup_batches"] == bench["warmup_batches"] == 2  # max(1, workers)
    assert monitor["input_bound"] == bench["wait_fraction"] == trial.wait_fraction
    for k in ("wait_s", "step_s", "wait_p50_ms", "wait_p95_ms", "wait_p99_ms"):
        assert monitor[k] == bench[k], k
    # a meter fed the same timings by a trainer's hooks, its loader unknown (one warm-up batch)
    timings = monitor["waits_s"], monitor["steps_s"], monitor["rows"]
    meter = StallMeter()
    for w, s, r in zip(*timings, strict=True):
        meter.record(w, s, r)
    th = tp.throughput(*timings, workers=0)
    assert meter.throughput() == th and th.warmup_batches == 1
    assert (meter.summary().samples_per_s, meter.summary().input_bound) == (th.samples_per_s,
                                                                            th.wait_fraction)
