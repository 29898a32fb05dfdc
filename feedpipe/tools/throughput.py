"""The one definition of a loader's samples/s, used by ``feedpipe bench``, ``feedpipe tune`` and
``benchmarks/harness.py``, so that their figures agree by construction.

A run of batches is timed by :class:`~feedpipe.tools.monitor.StallMeter` (per batch: the wait for
it, the step after it, its sample count). Start-up is excluded the same way everywhere: the first
batch carries it, and with ``w`` workers the next ``w - 1`` were decoded during it and arrive almost
at once, so the first ``max(1, w)`` batches are warm-up. The steady-state rate is the median of up
to three equal windows of the batches after warm-up, each spanning arrival to arrival (wait and
step both count): the median shrugs off one window disturbed by other processes. Wait statistics
cover the same post-warm-up batches.

A whole pass is also rated as it ran (``epoch_samples_per_s``: all samples over the time from asking
for the first batch to the end of the last step, start-up included). The benchmarks compare short
epochs side by side with it: when an epoch is only a few batches, those after warm-up were
prefetched during it and the steady-state windows would time a queue, not the pipeline.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Literal, Sequence

import numpy as np

from ..errors import ConfigError
from .monitor import LoaderInfo, StallMeter

WINDOWS = 3


def warmup_batches(workers: int | None) -> int:
    """Batches excluded as start-up: the first, plus those the other workers made meanwhile."""
    return max(1, workers or 0)


def steady_rate(waits: Sequence[float], steps: Sequence[float], rows: Sequence[int],
                warmup: int, windows: int = WINDOWS) -> float:
    """Median samples/s over ``windows`` equal runs of batches after the first ``warmup``.

    Each window spans arrival to arrival, so the warm-up batches' start-up cost is excluded.
    """
    n = len(waits)
    if warmup < 1 or n - warmup < windows:
        raise ConfigError(f"need {warmup} warm-up + {windows} batches to measure, got {n}")
    arrivals, t = [], 0.0
    for i, wait in enumerate(waits):
        t += wait
        arrivals.append(t)
        t += steps[i] if i < len(steps) else 0.0
    edges = [warmup - 1 + round(k * (n - warmup) / windows) for k in range(windows + 1)]
    rates = sorted(sum(rows[a + 1:b + 1]) / max(arrivals[b] - arrivals[a], 1e-9)
                   for a, b in zip(edges, edges[1:]))
    return statistics.median(rates)


@dataclass(frozen=True)
class Throughput:
    """One timed run: steady-state ``samples_per_s`` (see the module doc), the start-up
    (``first_batch_s``), the share and percentiles of waiting after warm-up, and the whole
    pass (``epoch_s``, ``epoch_samples_per_s``: start-up included)."""

    samples_per_s: float
    first_batch_s: float
    samples: int
    batches: int
    warmup_batches: int
    windows: int
    wait_fraction: float
    wait_p50_ms: float
    wait_p95_ms: float
    wait_p99_ms: float
    epoch_s: float
    epoch_samples_per_s: float

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)


@dataclass(frozen=True)
class Trial:
    """One loader configuration as ``feedpipe bench`` and ``feedpipe tune`` record it: measured
    (status "ok"), over tune's RAM budget ("skipped") or without its backend ("unavailable"),
    ``reason`` saying why; the latter two carry no figures (tune's: None).

    samples_per_s, first_batch_s and the wait figures are a :class:`Throughput`'s. mb_per_s is
    stored bytes read per second (mean stored bytes per sample × samples_per_s, in 10⁶ B/s);
    ``ram_bytes`` tune's estimate of the batches the loader holds (0: not estimated). The RSS
    peaks (:mod:`feedpipe.tools.rss`): the main process's high-water mark, and the peak of the
    workers' sum sampled every 50 ms (shared pages counted in each); cpu_util is the process
    tree's CPU time / wall time / usable cores. ``stall`` holds bench's meter summary, the
    Throughput and the per-batch timings.
    """

    format: str
    backend: str
    batch_size: int
    workers_requested: str
    workers: int | None = None
    prefetch: int | None = None
    status: Literal["ok", "unavailable", "skipped"] = "ok"
    reason: str = ""
    samples: int = 0
    batches: int = 0
    wall_s: float = 0.0
    first_batch_s: float | None = 0.0
    samples_per_s: float | None = 0.0
    bytes_per_sample: float = 0.0
    mb_per_s: float = 0.0
    wait_fraction: float = 0.0
    wait_p50_ms: float = 0.0
    wait_p95_ms: float = 0.0
    wait_p99_ms: float = 0.0
    peak_rss_main_mb: float = 0.0
    peak_rss_workers_mb: float = 0.0
    cpu_util: float = 0.0
    ram_bytes: int = 0
    stall: dict[str, Any] = field(default_factory=dict)
    best: bool = False
    source: str = ""  # bench's baseline input: "loose files" or "packed bytes"

    @property
    def label(self) -> str:
        """The plot line / progress stage this trial belongs to."""
        return f"{self.format} {self.backend} batch {self.batch_size}"

    @property
    def setting(self) -> str:
        """The loader setting tune compares: 'workers=2, prefetch=4'."""
        return f"workers={self.workers}" + (f", prefetch={self.prefetch}" if self.workers else "")

    def measured(self, th: "Throughput", **more: Any) -> "Trial":
        """This configuration with ``th``'s figures (and ``more``)."""
        return replace(self, samples=th.samples, batches=th.batches,
                       first_batch_s=th.first_batch_s, samples_per_s=th.samples_per_s,
                       wait_fraction=th.wait_fraction, wait_p50_ms=th.wait_p50_ms,
                       wait_p95_ms=th.wait_p95_ms, wait_p99_ms=th.wait_p99_ms, **more)


def throughput(waits: Sequence[float], steps: Sequence[float], rows: Sequence[int],
               workers: int | None) -> Throughput:
    """The figures of one run from its per-batch waits, steps and sample counts.

    Short runs keep at least one batch after warm-up and use fewer windows (``feedpipe bench``
    allows 2 batches); ``feedpipe tune`` always has three full windows. Fewer than 2 batches
    cannot be measured (a ConfigError).
    """
    n = len(waits)
    if n < 2:
        raise ConfigError(f"{n} batch(es) measured: samples/s needs at least 2 (the first is "
                          "start-up); run more batches")
    warmup = min(warmup_batches(workers), n - 1)
    windows = min(WINDOWS, n - warmup)
    after = np.asarray(waits[warmup:], dtype=np.float64)
    wait_s, step_s = float(after.sum()), float(sum(steps[warmup - 1:n - 1]))
    p50, p95, p99 = np.percentile(after, (50, 95, 99)) * 1e3
    epoch_s = float(sum(waits) + sum(steps))
    return Throughput(steady_rate(waits, steps, rows, warmup, windows), float(waits[0]),
                      int(sum(rows)), n, warmup, windows,
                      wait_s / (wait_s + step_s) if wait_s + step_s > 0 else 0.0,
                      float(p50), float(p95), float(p99), epoch_s,
                      sum(rows) / epoch_s if epoch_s > 0 else 0.0)


def of_meter(meter: StallMeter, workers: int | None) -> Throughput:
    """:func:`throughput` of everything ``meter`` timed."""
    return throughput(meter.waits, meter.steps, meter.rows, workers)


def time_epoch(loader: Iterable[Any], workers: int | None = None) -> Throughput:
    """One pass over ``loader`` (an epoch), timed and rated; ``workers`` defaults to the
    loader's own (feedpipe loader or torch DataLoader), else 0."""
    if workers is None:
        info = LoaderInfo.from_loader(loader)
        workers = info.num_workers if info is not None else 0
    meter = StallMeter(loader_info=LoaderInfo())
    for _ in meter.wrap(loader):
        pass
    return of_meter(meter, workers)
