"""The one definition of a loader's samples/s, used by ``StallMeter.summary``, ``feedpipe bench``,
``feedpipe tune`` and the benchmarks' harnesses, so that their figures agree by construction.

A run is timed per batch: the wait for it, the step after it, its samples. Batch ``i`` *arrives*
when its wait ends (the ask for the first stands in before it); a rate is the samples that
arrived in a window over its length, arrival to arrival (:func:`window_rate`).

- **Steady state** (``samples_per_s``): the first batch carries the start-up, and with ``w``
  workers the next ``w - 1`` were decoded during it, so the first ``max(1, w)`` batches are
  warm-up. The rate is the median of up to three equal windows after it, which shrugs off one
  window disturbed by other processes; the wait share and percentiles cover the same batches.
- **Whole pass** (``epoch_samples_per_s``): from the ask for the first batch to the last arrival,
  start-up included. Short epochs are compared with it: after warm-up their batches were
  prefetched, and the steady-state windows would time a queue, not the pipeline.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from itertools import pairwise
from typing import Any, Literal, Protocol, Sequence

import numpy as np

from ..errors import ConfigError

WINDOWS = 3


def warmup_batches(workers: int | None) -> int:
    """Batches excluded as start-up: the first, plus those the other workers made meanwhile."""
    return max(1, workers or 0)


def arrivals(waits: Sequence[float], steps: Sequence[float]) -> list[float]:
    """When each batch arrived, from the ask for the first: element ``i + 1`` is batch ``i``'s
    arrival, element 0 the ask (0.0)."""
    out, t = [0.0], 0.0
    for i, wait in enumerate(waits):
        t += wait
        out.append(t)
        t += steps[i] if i < len(steps) else 0.0
    return out


def window_rate(at: Sequence[float], rows: Sequence[int], after: int, last: int) -> float:
    """Samples/s of the batches ``after + 1 .. last`` (``after`` -1: from the ask), arrival to
    arrival, on the timeline ``at`` of :func:`arrivals`."""
    return sum(rows[after + 1:last + 1]) / max(at[last + 1] - at[after + 1], 1e-9)


def steady_rate(waits: Sequence[float], steps: Sequence[float], rows: Sequence[int],
                warmup: int, windows: int = WINDOWS) -> float:
    """Median samples/s over ``windows`` equal runs of batches after the first ``warmup``
    (``warmup`` 0: the first window starts at the ask for the first batch)."""
    n = len(waits)
    if warmup < 0 or windows < 1 or n - warmup < windows:
        raise ConfigError(f"need {warmup} warm-up + {windows} batches to measure, got {n}")
    at = arrivals(waits, steps)
    edges = [warmup - 1 + round(k * (n - warmup) / windows) for k in range(windows + 1)]
    return statistics.median(window_rate(at, rows, a, b) for a, b in pairwise(edges))


@dataclass(frozen=True)
class Throughput:
    """One timed run's figures: the steady state, the start-up (``first_batch_s``), the waiting
    after warm-up and the whole pass (``epoch_s``, ``epoch_samples_per_s``)."""

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
    wait_s: float
    step_s: float

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)


@dataclass(frozen=True)
class Trial:
    """One loader configuration as ``feedpipe bench`` and ``feedpipe tune`` record it: measured
    (status "ok"), over tune's RAM budget ("skipped") or without its backend ("unavailable", with
    the ``reason``; no figures). The rates and waits are a :class:`Throughput`'s; ``mb_per_s``
    stored bytes read (10⁶ B/s); ``ram_bytes`` tune's estimate of the batches held; the RSS peaks
    :mod:`feedpipe.tools.rss`'s; ``cpu_util`` the tree's CPU time / wall / usable cores; ``stall``
    bench's meter summary and per-batch timings.
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


class Timings(Protocol):
    """What a run's figures are computed from (a :class:`~feedpipe.tools.monitor.StallMeter`)."""

    waits: list[float]
    steps: list[float]
    rows: list[int]


def throughput(waits: Sequence[float], steps: Sequence[float], rows: Sequence[int],
               workers: int | None) -> Throughput:
    """The figures of one run from its per-batch waits, steps and sample counts; a short run
    keeps one batch after warm-up and fewer windows (at least 2 batches, else a ConfigError)."""
    n = len(waits)
    if n < 2:
        raise ConfigError(f"{n} batch(es) measured: samples/s needs at least 2 (the first is "
                          "start-up); run more batches")
    warmup = min(warmup_batches(workers), n - 1)
    windows = min(WINDOWS, n - warmup)
    after = np.asarray(waits[warmup:], dtype=np.float64)
    wait_s, step_s = float(after.sum()), float(sum(steps[warmup - 1:n - 1]))
    p50, p95, p99 = np.percentile(after, (50, 95, 99)) * 1e3
    at = arrivals(waits, steps)
    return Throughput(steady_rate(waits, steps, rows, warmup, windows), float(waits[0]),
                      int(sum(rows)), n, warmup, windows,
                      wait_s / (wait_s + step_s) if wait_s + step_s > 0 else 0.0,
                      float(p50), float(p95), float(p99), at[-1], window_rate(at, rows, -1, n - 1),
                      wait_s, step_s)


def of_meter(meter: Timings, workers: int | None) -> Throughput:
    """:func:`throughput` of everything ``meter`` timed."""
    return throughput(meter.waits, meter.steps, meter.rows, workers)
