"""``autotune``: choose ``num_workers`` and ``prefetch_factor`` by measuring, not by rule of thumb.

Short trials through ``make_loader`` grow the worker count (0, 1, 2, … up to the CPU budget)
until throughput stops improving, then try other prefetch depths for the worker counts near the
best. The cheapest configuration within ``tolerance`` of the best wins: fewest workers, then least
batch memory. The choice is cached per dataset and machine, so the next run starts tuned: one
JSON file per (dataset, machine, settings), reused only when all of them match.
(Workers read one whole batch per transaction, so there is no separate read batch size to tune.)
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from ..._version import __version__
from ...dataset.manifest import MANIFEST_NAME
from ...dataset.registry import DatasetReader, open_dataset
from ...errors import ConfigError
from ...loader.api import make_loader
from ...loader.config import Workers, auto_workers
from ...loader.memory import ring_bytes
from ...paths import cache_dir, write_atomic
from ...system import usable_cores
from .. import refuse, whole
from ..machine import cpu_model, host_available_bytes
from ..monitor import StallMeter, stream
from ..throughput import Trial, of_meter, warmup_batches

log = logging.getLogger("feedpipe.tune")
PREFETCH_DEPTHS = (1, 2, 4)
FIRST_PREFETCH = 2  # torch's default: the worker sweep runs at it, other depths come after


@dataclass(frozen=True)
class TuneResult:
    """The chosen loader settings, every trial, and why; ``cached`` when read from the cache."""

    num_workers: int
    prefetch_factor: int | None
    samples_per_s: float
    best_samples_per_s: float
    trials: tuple[Trial, ...]
    reason: str
    cached: bool = False
    cache_path: str | None = None

    def loader_options(self) -> dict[str, Any]:
        """The ``make_loader`` options this result stands for."""
        return {"num_workers": self.num_workers,
                "workers": Workers(prefetch_factor=self.prefetch_factor or "auto")}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TuneResult":
        """The inverse of :meth:`to_dict`; a TypeError when the choice is not a valid setting."""
        res = cls(**{**d, "trials": tuple(Trial(**t) for t in d["trials"])})
        if not (isinstance(res.num_workers, int) and res.num_workers >= 0
                and (res.prefetch_factor is None or isinstance(res.prefetch_factor, int))):
            raise TypeError(f"num_workers={res.num_workers!r}, prefetch_factor="
                            f"{res.prefetch_factor!r} are not loader settings")
        return res

    def report(self) -> str:
        """The trials as a table, then the choice and why."""
        rows = [f"{'workers':>7} {'prefetch':>8} {'samples/s':>10} {'start s':>8} "
                f"{'batch MiB':>9}  note"]
        for t in self.trials:
            sps = "-" if t.samples_per_s is None else f"{t.samples_per_s:.0f}"
            first = "-" if t.first_batch_s is None else f"{t.first_batch_s:.2f}"
            rows.append(f"{t.workers:>7} {t.prefetch or '-':>8} {sps:>10} {first:>8} "
                        f"{t.ram_bytes / 2**20:>9.1f}  {t.reason}".rstrip())
        return "\n".join(rows + [self.reason + (" (cached)" if self.cached else "")])


def measure(source: str | os.PathLike[str] | DatasetReader, batch_size: int, workers: int,
            prefetch: int | None, /, *, trial_batches: int = 24, **loader_options: Any) -> Trial:
    """Run one trial: ``trial_batches`` batches after start-up, rated by the one throughput
    measurement (:func:`feedpipe.tools.throughput.of_meter`), as ``feedpipe bench`` rates its."""
    opts = {**loader_options, "num_workers": workers}
    if workers:
        opts["workers"] = replace(opts.get("workers") or Workers(), prefetch_factor=prefetch)
    loader = make_loader(source, batch_size, **opts)
    meter = StallMeter()
    batches = stream(loader, warmup_batches(workers) + trial_batches, None)
    for _ in meter.wrap(batches):
        pass
    view = loader.describe()
    ram = ring_bytes(view.sample_bytes * batch_size, workers, prefetch or 0)
    del loader, batches  # shut the workers down before the next trial starts its own
    gc.collect()
    return Trial(view.format, view.backend, batch_size, str(workers), workers,
                 prefetch if workers else None, ram_bytes=ram).measured(of_meter(meter, workers))


def choose(trials: Sequence[Trial], tolerance: float) -> tuple[Trial, Trial]:
    """(chosen, best): the cheapest measured trial within ``tolerance`` of the fastest —
    fewest workers, then least batch memory, then shallowest prefetch."""
    ran = [t for t in trials if t.samples_per_s is not None]
    if not ran:
        raise ConfigError("autotune: every configuration was over the budget; raise budget_ram "
                          "or lower batch_size")
    best = max(ran, key=lambda t: t.samples_per_s or 0.0)
    floor = (best.samples_per_s or 0.0) * (1 - tolerance)
    near = [t for t in ran if (t.samples_per_s or 0.0) >= floor]
    return min(near, key=lambda t: (t.workers, t.ram_bytes, t.prefetch or 0)), best


@dataclass
class _Search:
    """The trials of one autotune run, respecting the budgets."""

    source: DatasetReader
    batch_size: int
    per_sample: int
    budget_ram: int
    trial_batches: int
    depths: tuple[int, ...]
    options: dict[str, Any]
    base: Trial  # the dataset and backend every trial shares
    trials: list[Trial] = field(default_factory=list)

    def ram(self, workers: int, prefetch: int) -> int:
        return ring_bytes(self.per_sample * self.batch_size, workers, prefetch)

    def run(self, workers: int, prefetch: int | None) -> Trial:
        ram = self.ram(workers, prefetch or 0)
        if ram > self.budget_ram:
            t = replace(self.base, workers_requested=str(workers), workers=workers,
                        prefetch=prefetch, status="skipped", first_batch_s=None,
                        samples_per_s=None, ram_bytes=ram,
                        reason=f"skipped: ~{ram >> 20} MiB of batches > the RAM budget of "
                               f"{self.budget_ram >> 20} MiB")
        else:
            t = measure(self.source, self.batch_size, workers, prefetch,
                        trial_batches=self.trial_batches, **self.options)
        log.info("autotune %s: %s", t.setting, t.reason or f"{t.samples_per_s:.0f} samples/s "
                 f"(start-up {t.first_batch_s:.2f} s, ~{t.ram_bytes >> 20} MiB of batches)")
        self.trials.append(t)
        return t

    def sweep_workers(self, max_workers: int, tolerance: float) -> None:
        """0 and 1 always (in-process versus one worker); then grow while it still pays."""
        first = FIRST_PREFETCH if FIRST_PREFETCH in self.depths else self.depths[0]
        best = 0.0
        for w in range(max_workers + 1):
            fits = [p for p in self.depths if p <= first and self.ram(w, p) <= self.budget_ram]
            t = self.run(w, (fits[-1] if fits else first) if w else None)
            if t.samples_per_s is None:
                break  # more workers need more memory still
            if w >= 2 and t.samples_per_s <= best * (1 + tolerance):
                break
            if w >= 1:
                best = max(best, t.samples_per_s)

    def confirm(self, repeats: int) -> None:
        """Measure every configuration that ran again, in interleaved rounds, keeping each one's
        fastest: load from other processes only ever slows a trial down."""
        for _ in range(repeats - 1):
            for i, t in enumerate(self.trials):
                if t.samples_per_s is not None:
                    again = measure(self.source, self.batch_size, t.workers, t.prefetch,
                                    trial_batches=self.trial_batches, **self.options)
                    if (again.samples_per_s or 0.0) > t.samples_per_s:
                        self.trials[i] = again

    def other_depths(self, tolerance: float) -> None:
        """Other prefetch depths for each worker count within tolerance of the best so far."""
        _, best = choose(self.trials, tolerance)
        floor = (best.samples_per_s or 0.0) * (1 - tolerance)
        for w in sorted({t.workers for t in self.trials if t.workers
                         and (t.samples_per_s or 0.0) >= floor}):
            for p in self.depths:
                if not any(t.workers == w and t.prefetch == p for t in self.trials):
                    self.run(w, p)


def cache_entry(reader: DatasetReader, batch_size: int,
                settings: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """What a cached result depends on (the dataset's path, manifest hash and mtime; the CPU
    model, usable cores, feedpipe and torch versions; every setting) and the file named by its
    hash."""
    manifest = reader.root / MANIFEST_NAME
    key = json.loads(json.dumps({
        "dataset": str(reader.root.resolve()),
        "manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest(),
        "manifest_mtime_ns": manifest.stat().st_mtime_ns,
        "machine": {"cpu": cpu_model(), "usable_cores": usable_cores(),
                    "feedpipe": __version__, "torch": torch.__version__},
        "batch_size": batch_size, "settings": settings,
    }, sort_keys=True, default=str))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return key, cache_dir() / f"tune-{digest}.json"


def read_cache(path: Path, key: dict[str, Any]) -> TuneResult | None:
    """The result stored at ``path`` for exactly ``key``, else None (a bad file is logged)."""
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key:
            return None
        return replace(TuneResult.from_dict(data["result"]), cached=True, cache_path=str(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("autotune: ignoring unreadable cache file %s (damaged, or of another "
                    "layout: %s); tuning again", path, exc)
        return None


def write_cache(path: Path, key: dict[str, Any], result: dict[str, Any]) -> None:
    """Write atomically (:func:`write_atomic`); a cache that cannot be written is logged, not
    raised: the next run simply tunes again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"key": key, "result": result}, indent=1))
    except OSError as exc:
        log.warning("autotune: could not write the cache %s (%s); the next run tunes again",
                    path, exc)


def autotune(source: str | os.PathLike[str] | DatasetReader, batch_size: int, *,
             budget_cpus: int | None = None, budget_ram: int | None = None,
             trial_batches: int = 24, tolerance: float = 0.05, repeats: int = 1,
             cache: bool = True, **loader_options: Any) -> TuneResult:
    """Measure loader configurations of ``source`` (a packed dataset's path or an opened
    dataset) at ``batch_size`` and return the cheapest within ``tolerance`` of the fastest:
    workers 0, 1, 2, ... until one more no longer pays, then prefetch depths near the best
    (docs/measure.md). A cache hit (same dataset, machine and settings) runs no trial.

    Args:
        budget_cpus: The most workers to try; None: this rank's share of the usable cores.
        budget_ram: Bytes of batches the loader may hold; None: the RAM available now.
        trial_batches: Batches timed per configuration.
        tolerance: The cheapest configuration within this share of the fastest wins.
        repeats: Measure each configuration this many times, interleaved, keeping its fastest
            (busy machines).
        cache: Read and write the cached choice.
        **loader_options: For every ``make_loader`` call; a ``prefetch_factor`` in their
            ``workers=Workers(...)`` is kept fixed.
    """
    if "num_workers" in loader_options:
        raise ConfigError("autotune chooses num_workers: leave it out of the loader options")
    refuse(("budget_cpus", budget_cpus, budget_cpus is None or whole(budget_cpus, 1),
            "use an int >= 1 (most workers to try)"),
           ("budget_ram", budget_ram, budget_ram is None or whole(budget_ram, 1),
            "use a positive int number of bytes"),
           ("tolerance", tolerance, isinstance(tolerance, (int, float)) and 0 <= tolerance < 1,
            "use 0 <= tolerance < 1"),
           ("trial_batches", trial_batches, whole(trial_batches, 3),
            "use an int >= 3 (three timed windows)"),
           ("repeats", repeats, whole(repeats, 1), "use an int >= 1"))
    fixed = (loader_options.get("workers") or Workers()).prefetch_factor  # Workers checked it
    depths = PREFETCH_DEPTHS if fixed == "auto" else (fixed,)
    max_workers = budget_cpus or auto_workers(True)  # this rank's share of the usable cores
    reader = source if isinstance(source, DatasetReader) else open_dataset(source)
    reader.require_samples("autotune")
    settings = {"budget_cpus": max_workers, "budget_ram": budget_ram, "depths": depths,
                "tolerance": tolerance, "trial_batches": trial_batches, "repeats": repeats,
                "options": {k: v for k, v in loader_options.items() if k != "world"}}
    key, path = cache_entry(reader, batch_size, settings)
    if cache and (hit := read_cache(path, key)) is not None:
        log.info("autotune: cache hit %s: %s", path, hit.reason)
        return hit
    probe = make_loader(reader, batch_size, num_workers=0, **loader_options)  # validates options
    ram_cap = budget_ram if budget_ram is not None else host_available_bytes()
    view = probe.describe()
    search = _Search(reader, batch_size, view.sample_bytes, ram_cap, trial_batches, depths,
                     loader_options, Trial(view.format, view.backend, batch_size, "0"))
    del probe
    search.sweep_workers(max_workers, tolerance)
    search.other_depths(tolerance)
    search.confirm(repeats)
    chosen, best = choose(search.trials, tolerance)
    reason = (f"chose {chosen.setting}: {chosen.samples_per_s:.0f} samples/s, within "
              f"{tolerance:.0%} of the best ({best.setting}: {best.samples_per_s:.0f} samples/s) "
              f"with the fewest workers, then the least batch memory "
              f"(~{chosen.ram_bytes / 2**20:.1f} MiB); {len(search.trials)} configurations "
              f"tried, up to {max_workers} workers")
    skipped = [t for t in search.trials if t.samples_per_s is None]
    if skipped:
        reason += f"; {len(skipped)} skipped over the RAM budget"
    log.info("autotune: %s", reason)
    result = TuneResult(chosen.workers, chosen.prefetch, chosen.samples_per_s or 0.0,
                        best.samples_per_s or 0.0, tuple(search.trials), reason,
                        cache_path=str(path) if cache else None)
    if cache:
        write_cache(path, key, result.to_dict())
    return result
