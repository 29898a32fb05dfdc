"""The one definition of a loader's samples/s, used by ``feedpipe bench``, ``feedpipe tune`` and
``benchmarks/harness.py``, so that their figures agree by construction.

A run of batches is timed by :class:`~feedpipe.tools.monitor.StallMeter` (per batch: the wait for
it, the step after it, its sample count). Start-up is excluded the same way everywhere: the first
batch carries it, and with ``w`` workers the next ``w - 1`` were decoded during it and arrive almost
at once, so the first ``max(1, w)`` batches are warm-up. The steady-state rate is the median of up
to three equal windows of the batches after warm-up, each spanning arrival to arrival (wait and
step both count): the median shrugs off one window disturbed by other processes. Wait statistics
cover the same post-warm-up batches.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

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
    (``first_batch_s``), and the share and percentiles of waiting after warm-up."""

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

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)


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
    return Throughput(steady_rate(waits, steps, rows, warmup, windows), float(waits[0]),
                      int(sum(rows)), n, warmup, windows,
                      wait_s / (wait_s + step_s) if wait_s + step_s > 0 else 0.0,
                      float(p50), float(p95), float(p99))


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
