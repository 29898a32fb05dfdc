"""``GpuMonitor``: GPU utilisation and memory sampled from NVML (``pip install 'feedpipe[gpu]'``)
in a background thread. An input-bound job's GPU swings 0% → 100% → 0% (a batch, then a wait);
a compute-bound one stays high. All NVML access goes through one sampler function, so any source
of samples (a test series) can stand in for it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from ..errors import ResourceError
from ..loader.gpu import import_nvml
from . import refuse


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU: utilisation in percent (0–100), memory in bytes."""

    index: int
    util: float
    mem_used: int
    mem_total: int


Sampler = Callable[[], list[GpuSample]]

LOW, HIGH = 20.0, 80.0  # utilisation (%) counted as "idle" / "busy" in the fluctuation verdict


def nvml_sampler() -> Sampler:
    """A sampler reading every GPU through NVML; raises a clear error without pynvml or a GPU."""
    pynvml = import_nvml()  # the one GPU probe (feedpipe.loader.gpu)
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                   for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as exc:
        raise ResourceError(f"NVML is installed but cannot start ({exc}): no NVIDIA driver "
                            "is loaded or no GPU is visible on this machine") from None
    if not handles:
        raise ResourceError("NVML started but sees no GPU (check CUDA_VISIBLE_DEVICES "
                            "and the container's GPU access)")

    def sample() -> list[GpuSample]:
        out = []
        for i, h in enumerate(handles):
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append(GpuSample(i, float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                                 int(mem.used), int(mem.total)))
        return out

    return sample


@dataclass(frozen=True)
class GpuStats:
    """Utilisation statistics of one GPU over a monitoring run, with a verdict."""

    index: int
    samples: int
    util_mean: float
    util_std: float
    util_p10: float
    util_p90: float
    frac_idle: float       # fraction of samples below LOW %
    frac_busy: float       # fraction of samples at or above HIGH %
    mem_used_mean: float   # bytes
    mem_used_peak: int
    mem_total: int
    verdict: str


@dataclass(frozen=True)
class GpuSummary:
    """Every GPU's statistics over ``duration_s`` seconds of sampling."""

    duration_s: float
    interval_s: float
    gpus: tuple[GpuStats, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)

    def __str__(self) -> str:
        return "\n".join(
            f"gpu{g.index}: {g.verdict}; util mean {g.util_mean:.0f}% (std {g.util_std:.0f}, "
            f"p10 {g.util_p10:.0f}, p90 {g.util_p90:.0f}; {g.frac_idle:.0%} of samples below "
            f"{LOW:.0f}%, {g.frac_busy:.0%} at {HIGH:.0f}%+), memory mean "
            f"{g.mem_used_mean / 2**30:.1f} GiB, peak {g.mem_used_peak / 2**30:.1f} of "
            f"{g.mem_total / 2**30:.1f} GiB ({g.samples} samples)" for g in self.gpus)


def gpu_verdict(util: np.ndarray) -> str:
    """Classify a utilisation series: fluctuating (input-bound pattern), busy, or underused."""
    if util.size < 3:
        return "too few samples"
    idle, busy = float(np.mean(util < LOW)), float(np.mean(util >= HIGH))
    if (idle >= 0.2 and busy >= 0.2) or float(util.std()) >= 30:
        return "fluctuating: likely input-bound"
    if float(util.mean()) >= HIGH:
        return "busy"
    if float(util.mean()) < 30:
        return "idle/underused"
    return "steady partial load: small batches or waits on the host"


def gpu_stats(index: int, util: list[float], used: list[int], total: int) -> GpuStats:
    """Statistics and verdict for one GPU's samples (at least one)."""
    u, m = np.asarray(util, dtype=np.float64), np.asarray(used, dtype=np.float64)
    p10, p90 = np.percentile(u, (10, 90))
    return GpuStats(index, int(u.size), float(u.mean()), float(u.std()), float(p10), float(p90),
                    float(np.mean(u < LOW)), float(np.mean(u >= HIGH)), float(m.mean()),
                    int(m.max()), total, gpu_verdict(u))


class GpuMonitor:
    """Samples every GPU each ``interval`` seconds in a daemon thread (``with GpuMonitor() as
    mon: train()``, then ``mon.summary()``); ``sampler`` defaults to :func:`nvml_sampler`;
    ``on_sample`` is called from the thread after each reading."""

    def __init__(self, interval: float = 1.0, sampler: Sampler | None = None,
                 on_sample: Callable[[float, list[GpuSample]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        refuse(("interval", interval, not isinstance(interval, bool)
                 and isinstance(interval, (int, float)) and interval > 0,
                 "use a positive number of seconds"),
               *((name, fn, fn is None or callable(fn), "pass a function (see the GpuMonitor "
                  "docstring)") for name, fn in (("sampler", sampler), ("on_sample", on_sample),
                                                 ("clock", clock))))
        self.interval = float(interval)
        self.sampler = sampler if sampler is not None else nvml_sampler()
        self.on_sample, self.clock = on_sample, clock
        self.records: list[tuple[float, list[GpuSample]]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> list[GpuSample]:
        """Take one reading now and record it."""
        t, samples = self.clock(), self.sampler()
        self.records.append((t, samples))
        if self.on_sample is not None:
            self.on_sample(t, samples)
        return samples

    def _run(self) -> None:
        deadline = self.clock()
        try:
            while not self._stop.is_set():
                self.sample_once()
                deadline += self.interval
                self._stop.wait(max(0.0, deadline - self.clock()))
        except Exception as exc:  # surfaced by stop(): the thread must not die silently
            self.error = exc

    def start(self) -> "GpuMonitor":
        """Start sampling in a daemon thread (first reading immediately)."""
        if self._thread is not None:
            raise RuntimeError("GpuMonitor already started; stop() it first")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="feedpipe-gpumon", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> GpuSummary:
        """Stop sampling, re-raise a sampler error from the thread, and return the summary."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.error is not None:
            raise self.error
        return self.summary()

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds (None: forever) while sampling; returns early on error."""
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> "GpuMonitor":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> GpuSummary:
        """Per-GPU statistics over the readings so far."""
        records = list(self.records)
        per: dict[int, tuple[list[float], list[int], int]] = {}
        for _, samples in records:
            for s in samples:
                util, used, _total = per.setdefault(s.index, ([], [], s.mem_total))
                util.append(s.util)
                used.append(s.mem_used)
        duration = records[-1][0] - records[0][0] if records else 0.0
        return GpuSummary(duration, self.interval,
                          tuple(gpu_stats(i, u, m, t) for i, (u, m, t) in sorted(per.items())))


def live_line(t0: float) -> Callable[[float, list[GpuSample]], None]:
    def show(t: float, samples: list[GpuSample]) -> None:
        print(f"{t - t0:7.1f} s  " + "  ".join(
            f"gpu{s.index} {s.util:3.0f}% {s.mem_used / 2**30:5.1f}/{s.mem_total / 2**30:.0f} GiB"
            for s in samples), flush=True)
    return show
