"""StallMeter arithmetic (injected clock), advice, GpuMonitor statistics (synthetic samples through
the sampler seam), the real no-NVML behaviour, and the ``feedpipe monitor`` command."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import N_PHOTOS
from torch.utils.data import DataLoader

import feedpipe
from feedpipe.cli import build_parser, main
from feedpipe.cli.monitor import run as cmd_monitor
from feedpipe.errors import ConfigError, FeedpipeError, MissingDependencyError, ResourceError
from feedpipe.loader.config import auto_workers, usable_cores
from feedpipe.loader.dali import pipeline as dali_pipeline
from feedpipe.tools.gpumon import GpuMonitor, GpuSample, nvml_sampler
from feedpipe.tools.monitor import LoaderInfo, StallMeter, StallSummary, advise


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TimedLoader:
    """Yields ``batches``; fetching batch i advances the clock by ``waits[i]`` seconds."""

    def __init__(self, clock: FakeClock, waits: list[float], batches: list[object]) -> None:
        self.clock, self.waits, self.batches = clock, waits, batches

    def __iter__(self):
        for w, b in zip(self.waits, self.batches, strict=True):
            self.clock.now += w
            yield b


def run(meter: StallMeter, clock: FakeClock, waits: list[float], steps: list[float],
        batches: list[object] | None = None) -> None:
    batches = batches if batches is not None else [{"x": np.zeros((2, 3))}] * len(waits)
    for _batch, step in zip(meter.wrap(TimedLoader(clock, waits, batches)), steps, strict=True):
        clock.now += step


def test_stall_arithmetic_exact() -> None:
    clock = FakeClock()
    meter = StallMeter(clock=clock)
    waits = [7.0] + [float(w) for w in range(101)]  # start-up, then 0..100 s
    sizes = [(i % 5) + 1 for i in range(102)]
    batches = [{"image": np.zeros((n, 4, 4, 3), np.uint8), "label": np.arange(n)} for n in sizes]
    run(meter, clock, waits, [2.0] * 102, batches)
    s = meter.summary()
    assert meter.waits == waits and meter.steps == [2.0] * 102
    assert (s.batches, s.samples, s.warmup_batches) == (102, sum(sizes), 1)
    assert s.first_batch_s == 7.0
    # the steady state after the first batch: its waits, and the steps between its arrivals
    assert s.wait_s == 5050.0 and s.step_s == 202.0
    assert s.wall_s == 7.0 + 5050.0 + 204.0
    assert s.input_bound == pytest.approx(5050.0 / 5252.0, rel=1e-12)
    assert (s.wait_p50_ms, s.wait_p95_ms, s.wait_p99_ms) == (50_000.0, 95_000.0, 99_000.0)
    # the median of three windows of 101 batches (34, 33, 34), arrival to arrival
    spans = [(1, 35), (35, 68), (68, 102)]
    rates = [sum(sizes[a:b]) / sum(2.0 + waits[i] for i in range(a, b)) for a, b in spans]
    assert s.samples_per_s == pytest.approx(sorted(rates)[1], rel=1e-12)
    assert s.verdict == "input-bound"
    d = s.to_dict()
    assert json.loads(json.dumps(d)) == d and isinstance(d["advice"], list) and d["advice"]


@pytest.mark.parametrize("wait,step,verdict", [
    (4.0, 6.0, "input-bound"),
    (3.0, 7.0, "partly input-bound"),         # exactly 30%: not above the threshold
    (1.0, 9.0, "partly input-bound"),
    (1.0, 19.0, "compute-bound"),             # exactly 5%
    (0.0, 5.0, "compute-bound"),
])
def test_verdict_thresholds(wait: float, step: float, verdict: str) -> None:
    clock = FakeClock()
    meter = StallMeter(clock=clock)
    run(meter, clock, [100.0] + [wait] * 30, [step] * 31)  # a slow start-up must not count
    s = meter.summary()
    assert s.input_bound == pytest.approx(30 * wait / (30 * wait + 30 * step), rel=1e-12)
    assert s.verdict == verdict


def test_context_manager_bounds_wall_and_break_records_last_step() -> None:
    clock = FakeClock()
    with StallMeter(clock=clock) as meter:
        clock.now += 5.0                     # set-up inside the block counts towards wall time
        for i, _ in enumerate(meter.wrap(TimedLoader(clock, [1.0] * 10, list(range(10))))):
            clock.now += 3.0
            if i == 3:
                break
        clock.now += 2.0
    s = meter.summary()
    assert meter.waits == [1.0] * 4 and meter.steps == [3.0] * 4
    assert (s.batches, s.samples) == (4, 4)  # non-array batches count one each
    assert s.wall_s == 5.0 + 4 * 4.0 + 2.0
    meter.reset()
    empty = meter.summary()
    assert (empty.batches, empty.samples, empty.wall_s, empty.wait_s) == (0, 0, 0.0, 0.0)
    assert "only 0 batch(es)" in empty.advice[0]


def test_sample_counting_tuple_and_bare_tensor() -> None:
    clock = FakeClock()
    meter = StallMeter(clock=clock)
    batches = [(torch.zeros(5, 3), torch.zeros(5)), torch.zeros(7, 2), ["a", np.zeros((3, 1))]]
    run(meter, clock, [1.0] * 3, [1.0] * 3, batches)
    assert meter.summary().samples == 5 + 7 + 3


def test_cuda_sync_true_needs_cuda_auto_does_not() -> None:
    if torch.cuda.is_available():
        clock = FakeClock()
        meter = StallMeter(cuda_sync=True, clock=clock)
        run(meter, clock, [1.0] * 3, [1.0] * 3)
        assert meter.summary().batches == 3
    else:
        with pytest.raises(ConfigError, match="cuda_sync=True.*CUDA is not available.*'auto'"):
            StallMeter(cuda_sync=True)
    with pytest.raises(ConfigError, match="cuda_sync='yes'"):
        StallMeter(cuda_sync="yes")  # type: ignore[arg-type]
    clock = FakeClock()
    meter = StallMeter(clock=clock)  # "auto", the default: runs anywhere
    run(meter, clock, [1.0] * 3, [2.0] * 3)
    assert meter.steps == [2.0] * 3


def test_readme_stall_example_runs_on_this_machine(packed: dict[str, Path]) -> None:
    """The docs' first StallMeter example (docs/measure.md), executed as written (CPU-only)."""
    readme = (Path(__file__).parents[1] / "docs" / "measure.md").read_text()
    block = readme.split("## Is my job input-bound?")[1].split("```python\n")[1].split("```")[0]
    assert "StallMeter(" in block and "cuda_sync=True" not in block
    loader = feedpipe.make_loader(packed["lmdb"], 16, size=32, device="cpu", num_workers=0)
    steps: list[int] = []
    scope = {"loader": loader, "train_step": lambda b: steps.append(len(b["label"])),
             "print": lambda *a: steps.append(-1)}
    exec(compile(block, "docs/measure.md", "exec"), scope)  # noqa: S102 - our own docs' code
    assert sum(s for s in steps if s > 0) == N_PHOTOS and steps[-1] == -1


def test_wraps_real_loader(packed: dict[str, Path]) -> None:
    loader = feedpipe.make_loader(packed["lmdb"], 16, size=32, device="cpu", num_workers=1)
    meter = StallMeter()
    n = 0
    for batch in meter.wrap(loader):
        n += 1
        assert batch["image"].shape[0] == len(batch["label"])
    s = meter.summary()
    assert s.batches == n == len(loader) == -(-N_PHOTOS // 16)
    assert s.samples == N_PHOTOS and len(meter.steps) == n
    assert s.wall_s >= s.first_batch_s + s.wait_s and 0.0 <= s.input_bound <= 1.0
    assert meter.loader_info == LoaderInfo(num_workers=1, usable_cores=usable_cores(),
                                           codec="jpeg", format="lmdb", batch_size=16,
                                           pin_memory=False, device="cpu", prefetch_factor=4,
                                           backend="torch", size=(32, 32))
    # the torch DataLoader it wraps is understood too
    assert LoaderInfo.from_loader(DataLoader(range(3), num_workers=1)).num_workers == 1
    assert LoaderInfo.from_loader(range(3)) is None


def _summary(bound: float, verdict: str, step_s: float = 10.0, p50: float = 5.0,
             p95: float = 6.0, first: float = 1.0, wall: float = 100.0) -> StallSummary:
    return StallSummary(batches=101, samples=1000, wall_s=wall, first_batch_s=first,
                        wait_s=bound * 10, step_s=step_s, input_bound=bound, wait_p50_ms=p50,
                        wait_p95_ms=p95, wait_p99_ms=p95, samples_per_s=10.0, verdict=verdict,
                        advice=())


def test_advice_follows_the_loader() -> None:
    s = _summary(0.6, "input-bound", step_s=0.5)   # 5 ms steps
    zero = advise(s, LoaderInfo(num_workers=0, usable_cores=8, codec="jpeg", format="lmdb",
                                batch_size=32, pin_memory=False, device="cuda"))
    text = "\n".join(zero)
    assert "`make_loader(..., num_workers='auto')` starts 8" in text and "--store raw" in text
    assert "pin_memory=True" in text and "(now 32)" in text and "DALI" in text
    assert "feedpipe convert imgs/" not in text   # already packed
    few = "\n".join(advise(s, LoaderInfo(num_workers=2, usable_cores=8, codec="jpeg",
                                         format="wds", device="cpu")))
    assert "num_workers=2 is not what 'auto' picks" in few and "starts 8" in few
    assert "DALI" not in few and "pin_memory" not in few
    full = "\n".join(advise(s, LoaderInfo(num_workers=8, usable_cores=8, codec="jpeg",
                                          format="lmdb")))
    assert "more workers will not help" in full
    raw = "\n".join(advise(_summary(0.6, "input-bound"), LoaderInfo(
        num_workers=0, usable_cores=8, codec="raw", format="lmdb", batch_size=256)))
    assert "stored raw" in raw and "--store raw" not in raw
    assert "batch_size" not in raw                   # 100 ms steps: not short
    for n in (0, 4):  # what 'auto' picks for raw data (the loader's own rule), not 0
        raw_workers = advise(s, LoaderInfo(num_workers=n, usable_cores=8, codec="raw",
                                           format="lmdb"))
        assert f"num_workers={n} is not what 'auto' picks" in raw_workers[0]
        assert f"starts {auto_workers(False, 8)} (what it picks for raw data" in raw_workers[0]
    assert not any("num_workers" in a for a in advise(s, LoaderInfo(
        num_workers=auto_workers(False, 8), usable_cores=8, codec="raw", format="lmdb")))
    loose = "\n".join(advise(s, None))
    assert "feedpipe convert" in loose and "loader_info" in loose
    bursty = "\n".join(advise(_summary(0.2, "partly input-bound", p50=0.5, p95=40.0,
                                       first=30.0), LoaderInfo(prefetch_factor=2)))
    assert "Workers(prefetch_factor=4))` (now 2)" in bursty and "first batch 30.0 s" in bursty
    ok = advise(_summary(0.01, "compute-bound"), LoaderInfo(num_workers=0, usable_cores=8))
    assert len(ok) == 1 and "speed up the step" in ok[0]


def _advised_options() -> set[str]:
    """Every ``make_loader(..., OPTIONS)`` the advice of StallMeter and doctor can give."""
    from feedpipe.tools import doctor

    texts = []
    for bound, verdict in ((0.6, "input-bound"), (0.2, "partly input-bound")):
        for n, codec, device, backend in itertools.product(
                (None, 0, 2, 8), ("jpeg", "raw"), ("cpu", "cuda"), (None, "torch", "dali")):
            info = LoaderInfo(num_workers=n, usable_cores=8, codec=codec, format="lmdb",
                              batch_size=32, pin_memory=False, device=device, backend=backend,
                              prefetch_factor=2 if n else None)
            texts += advise(_summary(bound, verdict, step_s=0.5, p50=0.5, p95=40.0), info)
        texts += advise(_summary(bound, verdict), None)
    findings = [*doctor.check_cores(8, 8, 2.0), *doctor.check_gpu(True, ["GPU"], None),
                *doctor.check_pinned(True, "cannot pin")]
    texts += [f.fix for f in findings]
    return {m for t in texts for m in re.findall(r"`make_loader\(\.\.\., (.*?)\)`", t)}


def test_every_piece_of_advice_runs(packed) -> None:
    """Advice names options make_loader takes today: each ``make_loader(..., OPTIONS)`` that
    StallMeter or doctor recommends is run; only a machine without CUDA or DALI may refuse it,
    and then by the option's value, never its name."""
    advised = _advised_options()
    assert {"num_workers='auto'", "num_workers=2", "backend='dali'", "device='cuda'",
            "workers=feedpipe.Workers(pin_memory=True)",
            "workers=feedpipe.Workers(pin_memory=False)"} <= advised
    assert any("prefetch_factor=" in a for a in advised)
    for options in sorted(advised):
        kwargs = eval(f"dict({options})", {"feedpipe": feedpipe})  # noqa: S307 - our own text
        try:
            loader = feedpipe.make_loader(packed["lmdb"], 4, size=16, **kwargs)
            assert next(iter(loader))["image"].shape[0] == 4
            loader.close()
        except (ConfigError, MissingDependencyError) as exc:
            assert "did you mean" not in str(exc) and "unexpected" not in str(exc), options
            assert ("device" in kwargs and not torch.cuda.is_available()) or "backend" in kwargs


@pytest.mark.parametrize("cuda, wheel", [("12.4", "nvidia-dali-cuda120"),
                                         ("13.0", "nvidia-dali-cuda130")])
def test_dali_advice_names_the_wheel_for_torchs_cuda(monkeypatch: pytest.MonkeyPatch,
                                                     cuda: str, wheel: str) -> None:
    monkeypatch.setattr(dali_pipeline, "DALI_MODULE", "nvidia.no_such_dali")  # not installed
    monkeypatch.setattr(torch.version, "cuda", cuda)
    text = "\n".join(advise(_summary(0.6, "input-bound"), LoaderInfo(
        num_workers=8, usable_cores=8, codec="jpeg", format="lmdb", device="cuda")))
    assert f"pip install {wheel} " in text


def test_bad_arguments_name_the_parameter() -> None:
    with pytest.raises(ConfigError, match="clock=5: pass a function"):
        StallMeter(clock=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="loader_info=.*LoaderInfo.from_loader"):
        StallMeter(loader_info={"num_workers": 2})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="interval='1': use a positive number"):
        GpuMonitor(interval="1", sampler=list)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="sampler=5: pass a function"):
        GpuMonitor(sampler=5)  # type: ignore[arg-type]


def _feed(series: dict[int, list[float]], mem: list[int] | None = None) -> GpuMonitor:
    """A monitor fed ``series`` (GPU index -> utilisation per reading) through the sampler seam."""
    n = len(next(iter(series.values())))
    mem = mem or [1 << 30] * n
    readings = iter([[GpuSample(i, u[k], mem[k], 8 << 30) for i, u in series.items()]
                     for k in range(n)])
    clock = FakeClock()
    mon = GpuMonitor(interval=0.5, sampler=lambda: next(readings), clock=clock)
    for _ in range(n):
        mon.sample_once()
        clock.now += 0.5
    return mon


def test_gpu_summary_statistics() -> None:
    ramp = [float(u) for u in range(101)]
    mem = [(1 + k % 3) << 30 for k in range(101)]
    s = _feed({0: ramp, 1: [90.0] * 101}, mem).summary()
    assert s.duration_s == 50.0 and [g.index for g in s.gpus] == [0, 1]
    g = s.gpus[0]
    assert (g.samples, g.util_mean, g.util_p10, g.util_p90) == (101, 50.0, 10.0, 90.0)
    assert g.util_std == pytest.approx(np.sqrt((101**2 - 1) / 12), rel=1e-12)
    assert (g.frac_idle, g.frac_busy) == (20 / 101, 21 / 101)
    assert g.mem_used_peak == 3 << 30 and g.mem_total == 8 << 30
    assert g.mem_used_mean == pytest.approx(sum(mem) / 101, rel=1e-12)
    assert s.gpus[1].util_std == 0.0 and s.gpus[1].verdict == "busy"
    assert json.loads(json.dumps(s.to_dict()))["gpus"][1]["util_mean"] == 90.0


@pytest.mark.parametrize("series,verdict", [
    ([0.0, 100.0, 0.0, 100.0, 5.0, 98.0], "fluctuating: likely input-bound"),
    ([0.0, 0.0, 0.0, 0.0, 100.0, 100.0, 100.0, 0.0, 0.0, 0.0], "fluctuating: likely input-bound"),
    ([95.0, 97.0, 99.0, 96.0, 98.0], "busy"),
    ([0.0, 1.0, 2.0, 0.0, 5.0], "idle/underused"),
    ([50.0, 55.0, 45.0, 50.0], "steady partial load: small batches or waits on the host"),
    ([0.0, 100.0], "too few samples"),
])
def test_gpu_verdict(series: list[float], verdict: str) -> None:
    assert _feed({0: series}).summary().gpus[0].verdict == verdict


def test_gpu_monitor_thread_and_sampler_errors() -> None:
    with GpuMonitor(interval=0.001, sampler=lambda: [GpuSample(0, 42.0, 5, 10)]) as mon:
        mon.join(0.05)
    s = mon.summary()
    assert s.gpus[0].samples == len(mon.records) >= 1 and s.gpus[0].util_mean == 42.0
    calls = iter(range(10))

    def lost() -> list[GpuSample]:
        if next(calls) >= 2:
            raise ResourceError("GPU fell off the bus")
        return [GpuSample(0, 10.0, 1, 2)]

    mon = GpuMonitor(interval=0.001, sampler=lost).start()
    mon.join()                                   # the thread ends by itself on the error
    with pytest.raises(ResourceError, match="fell off"):
        mon.stop()
    assert len(mon.records) == 2
    with pytest.raises(ConfigError, match="interval=0"):
        GpuMonitor(interval=0, sampler=lost)


def _nvml_error() -> FeedpipeError | None:
    try:
        sample = nvml_sampler()
    except (MissingDependencyError, ResourceError) as exc:
        return exc
    readings = sample()                          # a real GPU: the real sampler must work
    assert readings and all(0 <= r.util <= 100 and r.mem_total > 0 for r in readings)
    return None


def test_no_nvml_real_and_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    err = _nvml_error()
    if err is not None:
        msg = str(err)
        assert ("pip install 'feedpipe[gpu]'" in msg if isinstance(err, MissingDependencyError)
                else "no NVIDIA driver" in msg or "no GPU" in msg)
        with pytest.raises(type(err)):
            GpuMonitor()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the package is not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'feedpipe\[gpu\]'"):
        GpuMonitor()


def test_cli_monitor_without_nvml(capsys: pytest.CaptureFixture[str]) -> None:
    if _nvml_error() is None:
        pytest.skip("NVML and a GPU are available here: the error path cannot be exercised")
    assert main(["monitor", "--duration", "0.2", "--interval", "0.1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("feedpipe monitor: error: ") and ("feedpipe[gpu]" in err or "GPU" in err)
    proc = subprocess.run([sys.executable, "-m", "feedpipe.cli", "monitor", "--duration", "0.1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "feedpipe monitor: error:" in proc.stderr
    assert main(["monitor", "--interval", "0"]) == 2
    assert "--interval 0.0: use a positive" in capsys.readouterr().err  # the CLI's spelling


def test_cli_monitor_with_sampler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpu.json"
    args = build_parser().parse_args(["monitor", "--interval", "0.01", "--duration", "0.05",
                                      "--json", str(out)])
    assert args.func is cmd_monitor
    sample = [GpuSample(0, 40.0, 3 << 30, 16 << 30), GpuSample(1, 100.0, 1 << 30, 16 << 30)]
    assert cmd_monitor(args, sampler=lambda: sample) == 0
    text = capsys.readouterr().out
    assert "gpu0  40%   3.0/16 GiB" in text and "gpu1 100%" in text
    assert "gpu0: steady partial load" in text and "gpu1: busy" in text
    data = json.loads(out.read_text())
    assert [g["util_mean"] for g in data["gpus"]] == [40.0, 100.0]
    assert data["gpus"][0]["mem_used_peak"] == 3 << 30 and data["interval_s"] == 0.01
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.json"]  # written atomically
    calls: list[int] = []
    args = build_parser().parse_args(["monitor", "--duration", "0.05", "--json",
                                      str(tmp_path / "missing" / "gpu.json")])
    with pytest.raises(ConfigError, match="--json .*missing does not exist"):
        cmd_monitor(args, sampler=lambda: calls.append(1) or sample)
    assert calls == []  # refused before sampling started
    args = build_parser().parse_args(["monitor", "--duration", "-1"])
    with pytest.raises(ConfigError, match="--duration -1"):
        cmd_monitor(args, sampler=lambda: sample)


def test_advice_uses_the_loaders_size_and_device(packed) -> None:
    """The advice said `--resize 224` to a loader at size 128, and 'per GPU' on a
    CPU-only run. It now takes both from the loader itself (its describe())."""
    loader = feedpipe.make_loader(packed["lmdb"], 16, size=128, num_workers=0, device="cpu")
    info = LoaderInfo.from_loader(loader)
    assert info is not None and info.size == (128, 128) and info.device == "cpu"
    text = "\n".join(advise(_summary(0.6, "input-bound"), info))
    assert "--store raw --resize 128`" in text and "224" not in text and "DALI" not in text
    wide = LoaderInfo.from_loader(feedpipe.make_loader(packed["lmdb"], 16, size=(96, 160),
                                                       num_workers=0, device="cpu"))
    assert "--resize 96x160`" in "\n".join(advise(_summary(0.6, "input-bound"), wide))
    busy = "\n".join(advise(_summary(0.01, "compute-bound"), info))
    assert "speed up the step" in busy and "GPU" not in busy and "a larger batch" in busy
    gpu = advise(_summary(0.01, "compute-bound"), replace(info, device="cuda"))
    assert "a larger batch per GPU" in gpu[0]
    if not torch.cuda.is_available():  # a plain DataLoader (device unknown) on a CPU machine
        plain = "\n".join(advise(_summary(0.01, "compute-bound"), LoaderInfo(num_workers=2)))
        assert "GPU" not in plain
