"""A small benchmark harness: warm-up, median of repeats, one table, JSON out, machine info.

A run returns the items it processed (timed here, call to return), or, for a loader epoch
(:func:`drain`), a :class:`~feedpipe.tools.throughput.Throughput`, the record ``feedpipe bench`` and
``feedpipe tune`` rate too: the harness takes its whole-pass rate (``epoch_samples_per_s``, the
one definition's window with no warm-up), since benchmark epochs are a few batches, where a
steady-state window would time the prefetch queue."""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Union

from feedpipe.tools.monitor import time_epoch
from feedpipe.tools.throughput import Throughput

Items = Union[int, Throughput]


@dataclass
class Result:
    """One configuration's figures: ``items`` per run, the per-run seconds, the per-run
    whole-epoch rates of loader runs, and notes."""

    name: str
    items: int
    seconds: list[float] = field(default_factory=list)
    note: str = ""
    rates: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Median whole-epoch samples/s of loader runs, else items / median seconds."""
        if self.rates:
            return statistics.median(self.rates)
        return self.items / statistics.median(self.seconds)

    def add(self, got: Items, seconds: float) -> None:
        """Record one run's result and duration."""
        if isinstance(got, Throughput):
            self.items = got.samples
            self.rates.append(got.epoch_samples_per_s)
        else:
            self.items = got
        self.seconds.append(seconds)


def measure(name: str, run: Callable[[], Items], *, repeats: int = 3, warmup: int = 1,
            note: str = "") -> Result:
    """Call ``run`` (returns items processed, or a loader epoch's Throughput) ``warmup`` times,
    then time ``repeats`` calls."""
    for _ in range(warmup):
        run()
    res = Result(name, 0, note=note)
    for _ in range(repeats):
        t = time.perf_counter()
        got = run()
        res.add(got, time.perf_counter() - t)
    print(f"  {name:<44} {res.rate:>10,.0f} /s   {note}", flush=True)
    return res


def measure_side_by_side(runs: dict[str, Callable[[], Items]], *, repeats: int = 5,
                         warmup: int = 1) -> list[Result]:
    """Time several configurations in interleaved rounds (A B C A B C ...), median per one.

    On a noisy machine a slow spell then hits every configuration alike, so their ratios hold
    where back-to-back blocks of repeats would credit the noise to whichever ran during it."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    results = {name: Result(name, 0) for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            t = time.perf_counter()
            got = run()
            results[name].add(got, time.perf_counter() - t)
    for r in results.values():
        print(f"  {r.name:<44} {r.rate:>10,.0f} /s", flush=True)
    return list(results.values())


def one_thread(_: int = 0) -> None:
    """DataLoader ``worker_init_fn``: one torch thread per worker, as feedpipe's own workers."""
    from feedpipe.workers import single_threaded

    single_threaded()


def drain(loader: object) -> Throughput:
    """One epoch of a loader (feedpipe's or a DataLoader, batches of dicts or tuples), timed by
    the one throughput measurement (:func:`feedpipe.tools.monitor.time_epoch`)."""
    return time_epoch(loader)  # type: ignore[arg-type]


def machine() -> dict[str, object]:
    """CPU model, usable cores, CPU quota, GPUs and library versions, recorded with every result
    (the keys of the first results, read through :mod:`feedpipe.tools.machine`)."""
    import numpy
    import torch

    from feedpipe.tools import machine as m

    return {"cpu": m.cpu_model(), "usable_cores": m.usable_cores(),
            "cgroup_cpu_limit": m.cgroup_cpu_limit(), "gpus": [g["name"] for g in m.gpus()],
            "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, **m.decoder_info()}


def save(path: Path, results: list[Result], extra: dict[str, object]) -> None:
    """Write every figure plus the machine description as JSON (atomically)."""
    from feedpipe.paths import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"machine": machine(), **extra,
                                   "results": [{**asdict(r), "rate": r.rate} for r in results]},
                                  indent=1).encode())
