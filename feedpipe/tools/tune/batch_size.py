"""``find_batch_size``: the batch size that trains within memory, found by real training steps.

Each trial runs forward + backward (+ optimizer step) at one size. On CUDA a trial fails when it
raises out-of-memory (or exceeds ``memory_budget``); on CPU when the process's peak resident
memory grows past the budget (:class:`~feedpipe.tools.rss.HostPeak`). Memory is freed between
trials so a failed trial does not poison the next; the model's and optimizer's state are restored.
On CPU the search has default caps (half the RAM available, :data:`CPU_TIME_BUDGET_S` seconds):
a CPU trains slowly, so doubling to ``max_size`` unbounded ran for 20 minutes and 9 GB. Each trial
is shown as it ends (a tqdm line on stderr).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Literal

import torch
from torch.utils._pytree import tree_leaves, tree_map_only
from tqdm import tqdm

from ...dataset.registry import DatasetReader
from ...errors import ConfigError
from ...loader.api import make_loader
from ...loader.config import PREFETCH_DECODE, auto_workers
from ...loader.memory import ring_bytes
from .. import refuse, whole
from ..machine import host_available_bytes
from ..rss import HostPeak, exact_heap

log = logging.getLogger("feedpipe.tune")
CPU_TIME_BUDGET_S = 120.0  # the search's default time cap on CPU (None on CUDA)
CPU_MEMORY_SHARE = 0.5  # on CPU the default memory budget: this share of the RAM available
#: the most of the RAM available the loader's batches may take: the training process, its pinned
#: buffers and the page cache need the rest (on a GPU, the largest fitting batch of a ResNet-50
#: would otherwise have the loader hold 111 of 128 GiB)
LOADER_RAM_SHARE = 0.5
Mode = Literal["largest", "fastest"]
Batch = Any
StepFn = Callable[[torch.nn.Module, Batch], torch.Tensor]


def default_step(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Forward the batch's input (``image`` of a dict, first of a tuple, or the tensor); the loss is
    cross-entropy against ``label`` for N×C logits, else the output's mean."""
    label = None
    if isinstance(batch, dict):
        if "image" not in batch:
            raise ConfigError(f"find_batch_size: the batch has {sorted(batch)}, no 'image'; pass "
                              "step=lambda model, batch: loss")
        x, label = batch["image"], batch.get("label")
    elif isinstance(batch, (tuple, list)):
        x, label = batch[0], batch[1] if len(batch) > 1 else None
    else:
        x = batch
    out = model(x)
    if isinstance(label, torch.Tensor) and out.ndim == 2 and not label.is_floating_point():
        return torch.nn.functional.cross_entropy(out.float(), label)
    return out.float().mean()


def tile(batch: Batch, size: int) -> Batch:
    """``batch`` repeated along its first dimension to ``size`` rows (tensors, per-sample lists)."""
    if isinstance(batch, torch.Tensor):
        return batch[torch.arange(size, device=batch.device) % batch.shape[0]]
    if isinstance(batch, dict):
        return {k: tile(v, size) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)) and batch and all(isinstance(v, torch.Tensor)
                                                          for v in batch):
        return type(batch)(tile(v, size) for v in batch)
    if isinstance(batch, list):
        return [batch[i % len(batch)] for i in range(size)]
    return batch


def free_device_memory(device: Any) -> None:
    """Collect garbage and, on CUDA, return cached blocks and reset the peak counters."""
    gc.collect()
    if getattr(device, "type", None) == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


@dataclass(frozen=True)
class BatchTrial:
    """One trial at ``size``: its peak memory (bytes; None when not run) and training speed."""

    size: int
    ok: bool
    peak_bytes: int | None
    samples_per_s: float | None
    note: str = ""
    seconds: float | None = None  # the trial's wall time (None: not run)


@dataclass(frozen=True)
class BatchSizeResult:
    """The chosen batch size, the largest that fitted, and every trial that led there."""

    batch_size: int
    largest_fit: int
    mode: Mode
    device: str
    budget_bytes: int | None
    loader_ram_bytes: int
    trials: tuple[BatchTrial, ...]
    reason: str
    time_budget_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)

    def report(self) -> str:
        """The trials as a table, then the choice and why."""
        rows = [f"{'size':>6} {'peak MiB':>9} {'samples/s':>10}  result"]
        for t in self.trials:
            peak = "-" if t.peak_bytes is None else f"{t.peak_bytes / 2**20:.1f}"
            sps = "-" if t.samples_per_s is None else f"{t.samples_per_s:.0f}"
            rows.append(f"{t.size:>6} {peak:>9} {sps:>10}  {'ok' if t.ok else 'oom'}"
                        + (f" ({t.note})" if t.note else ""))
        return "\n".join(rows + [self.reason])


def search_batch_size(fits: Callable[[int], bool], *, max_size: int, start: int = 1,
                      resolution: float = 1 / 32) -> int:
    """Largest size in [1, max_size] for which a monotone ``fits`` holds (0 if none): doubles
    from ``start`` until a size fails, then bisects until the gap is within ``resolution`` of the
    fitting size, never above a known failure."""
    lo, hi, size = 0, None, start
    while hi is None:
        if not fits(size):
            hi = size
        elif size >= max_size:
            return size
        else:
            lo, size = size, min(2 * size, max_size)
    while hi - lo > max(1, int(lo * resolution)):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def pick_size(trials: list[BatchTrial], largest: int, mode: Mode,
              margin: float) -> tuple[int, str]:
    """(size, why): ``largest`` less ``margin``, or with ``mode="fastest"`` the trial with the best
    samples/s among those that fitted at or below that cap."""
    cap = max(1, math.floor(largest * (1 - margin)))
    if mode == "fastest":
        ok = [t for t in trials if t.ok and t.size <= cap and t.samples_per_s]
        if ok:
            best = max(ok, key=lambda t: t.samples_per_s or 0.0)
            return best.size, (f"fastest fitting size within the {margin:.0%} margin (cap {cap}):"
                               f" {best.size} at {best.samples_per_s:.0f} samples/s")
    return cap, f"largest fit {largest} less {margin:.0%} margin: {cap}"


def _is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text \
        or "can't allocate memory" in text


def _batch_source(source: Any, device: torch.device, max_size: int,
                  loader_options: dict[str, Any]) -> tuple[Callable[[int], Batch], int]:
    """(size -> batch on ``device``, host bytes per sample the loader holds)."""
    if callable(source) and not isinstance(source, (str, os.PathLike, DatasetReader)):
        probe = source(min(8, max_size))
        per_sample = sum(t.nbytes for t in tree_leaves(probe) if isinstance(t, torch.Tensor)) \
            // max(1, min(8, max_size))
        return (lambda size: tree_map_only(torch.Tensor, lambda t: t.to(device), source(size))), \
            per_sample
    opts = {"shuffle": False, **loader_options, "num_workers": 0, "device": device}
    loader = make_loader(source, min(64, max_size), **opts)
    base = next(iter(loader))
    return (lambda size: tile(base, size)), loader.describe().sample_bytes


def _dist_min(values: list[float]) -> list[float]:
    """Element-wise minimum over all ranks when torch.distributed is initialized."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return values
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t.tolist()


class _Trials:
    """Runs and records trials; one instance per search."""

    def __init__(self, model: torch.nn.Module, make_batch: Callable[[int], Batch], step: StepFn,
                 optimizer: torch.optim.Optimizer | None, amp: bool, device: torch.device,
                 steps: int, budget: int | None, clock: Callable[[], float],
                 seconds: float | None = None, progress: bool = False) -> None:
        self.model, self.make_batch, self.step, self.optimizer = model, make_batch, step, optimizer
        self.amp, self.device, self.steps, self.budget = amp, device, steps, budget
        self.clock, self.seconds, self.t0 = clock, seconds, clock()
        caps = [f"{budget / 2**20:,.0f} MiB" if budget else "", f"{seconds:.0f} s" if seconds else ""]
        within = f" (within {', '.join(c for c in caps if c)})" if any(caps) else ""
        self.bar = tqdm(total=None, unit="trial", dynamic_ncols=True, desc=f"find_batch_size on "
                        f"{device.type}{within}") if progress else None  # a trial per tick
        self.cuda = device.type == "cuda"
        self.host = None if self.cuda else HostPeak()
        self.baseline = 0
        self.done: list[BatchTrial] = []

    def start(self, size: int) -> None:
        """On CPU, note the resident memory every trial's peak is measured from, after one
        forward + backward at the first trial's ``size`` so that one-time runtime set-up (thread
        pools, kernels: 10-18 MiB on the reference machine) is not charged to the first trial."""
        if self.host is not None:
            try:
                self._train(self.make_batch(size), optimizer_step=False)
            except (RuntimeError, MemoryError) as exc:
                if not _is_oom(exc):
                    raise
                raise ConfigError(f"find_batch_size: the warm-up at start={size} ran out of "
                                  "memory; use a smaller start", option="start") from exc
            free_device_memory(self.device)
            self.host.reset()
            self.baseline = self.host.rss()

    def _train(self, batch: Batch, optimizer_step: bool = True) -> None:
        """One forward + backward (+ optimizer step); gradients are dropped afterwards."""
        with torch.autocast(self.device.type, enabled=self.amp,
                            dtype=torch.float16 if self.cuda else torch.bfloat16):
            loss = self.step(self.model, batch)
        loss.backward()
        if self.optimizer is not None and optimizer_step:
            self.optimizer.step()
        self.model.zero_grad(set_to_none=True)

    def fits(self, size: int) -> bool:
        trial = self._skip(size) or self._run(size)
        ok, sps = _dist_min([float(trial.ok), trial.samples_per_s or 0.0])
        if trial.ok and not ok:
            trial = replace(trial, ok=False, samples_per_s=None,
                            note="out of memory on another rank")
        elif trial.ok:
            trial = replace(trial, samples_per_s=sps)
        log.info("batch size %d: %s, peak %s bytes, %s samples/s %s", size,
                 "ok" if trial.ok else "oom", trial.peak_bytes, trial.samples_per_s, trial.note)
        if self.bar is not None:  # the last trial's verdict beside the count
            self.bar.set_postfix_str(f"batch {size}: ok, {trial.samples_per_s:,.0f} samples/s, "
                                     f"peak {(trial.peak_bytes or 0) / 2**20:,.0f} MiB" if trial.ok
                                     else f"batch {size}: does not fit "
                                     f"({trial.note or 'out of memory'})", refresh=False)
            self.bar.update(1)
        self.done.append(trial)
        return trial.ok

    def _skip(self, size: int) -> BatchTrial | None:
        """A size not run, its need predicted linearly in size from the trials so far: on CPU
        memory over the RAM available (the kernel would kill the process, not raise), or time
        over the budget left (the first trial always runs: nothing to predict from)."""
        mem = [t.peak_bytes / t.size for t in self.done if t.ok and t.peak_bytes]
        if not self.cuda and mem:
            need, avail = int(max(mem) * size), host_available_bytes()
            if need > avail:
                return BatchTrial(size, False, None, None, f"not run: needs ~{need >> 20} MiB, "
                                  f"{avail >> 20} MiB of host RAM available")
        rates = [t.seconds / t.size for t in self.done if t.seconds]
        if self.seconds is not None and rates:
            left, need_s = self.seconds - (self.clock() - self.t0), max(rates) * size
            if left <= 0 or need_s > left:
                return BatchTrial(size, False, None, None, f"not run: ~{need_s:.1f} s, "
                                  f"{max(left, 0):.1f} s of the {self.seconds:.0f} s time budget "
                                  "left")
        return None

    def _steps(self, size: int) -> float:
        """Run warm-up + timed training steps at ``size``; the median step's samples/s."""
        batch = self.make_batch(size)
        times = []
        for i in range(self.steps + 1):
            t0 = self.clock()
            self._train(batch)
            if self.cuda:
                torch.cuda.synchronize(self.device)
            if i:
                times.append(self.clock() - t0)
        return size / max(statistics.median(times), 1e-9)

    def _run(self, size: int) -> BatchTrial:
        free_device_memory(self.device)
        if self.host is not None:
            self.host.reset()
        t0 = self.clock()
        try:
            sps: float | None = self._steps(size)
            note = ""
        except (RuntimeError, MemoryError) as exc:
            if not _is_oom(exc):
                raise
            sps, note = None, str(exc).strip().splitlines()[0][:120]
        finally:
            self.model.zero_grad(set_to_none=True)
        if self.cuda:
            peak = torch.cuda.max_memory_reserved(self.device)
        else:
            peak = self.host.peak() - self.baseline  # type: ignore[union-attr]
        ok = sps is not None
        if ok and self.budget is not None and peak > self.budget:
            ok, note = False, f"peak {peak / 2**20:.1f} MiB > budget {self.budget / 2**20:.1f} MiB"
        return BatchTrial(size, ok, peak, sps if ok else None, note, self.clock() - t0)


def find_batch_size(model: torch.nn.Module, sample_batch_fn_or_source: Any, *,
                    optimizer: torch.optim.Optimizer | None = None, amp: bool = False,
                    margin: float = 0.1, max_size: int = 4096, mode: Mode = "largest",
                    device: str | torch.device | None = None, memory_budget: int | None = None,
                    loader_prefetch: int = PREFETCH_DECODE, loader_workers: int | None = None,
                    step: StepFn | None = None, start: int = 1, steps: int = 3,
                    resolution: float = 1 / 32, clock: Callable[[], float] = time.perf_counter,
                    time_budget: float | None | Literal["auto"] = "auto", progress: bool = True,
                    **loader_options: Any) -> BatchSizeResult:
    """Find the batch size to train ``model`` with, by trials of real forward + backward +
    optimizer steps (model and optimizer state restored afterwards): doubled, then bisected.
    Under torch.distributed all ranks run the same trials and agree on the minimum.

    Args:
        sample_batch_fn_or_source: A function ``size -> batch``, or a packed dataset (path or
            reader, loaded with ``make_loader(..., **loader_options)`` and tiled to each size).
        optimizer: Stepped in each trial (its state's memory counts); None: no step.
        amp: Run the step under autocast (float16 on CUDA, bfloat16 on CPU).
        margin: ``mode="largest"`` returns the largest fitting size less this share;
            ``mode="fastest"`` the best samples/s at or under that.
        device: Where to train; None: the device of the model's parameters.
        memory_budget: Bounds the growth of peak resident memory on CPU (default: half the RAM
            available now), of peak reserved memory on CUDA (default: out-of-memory only).
        loader_workers, loader_prefetch: The loader's workers (None: its default) × prefetch:
            the batches it holds at the size are capped at half the RAM available.
        step: ``step(model, batch) -> loss``; None: :func:`default_step`.
        start, max_size, steps: The first and largest sizes tried; timed steps per trial.
        resolution: The bisection stops within this share of the fitting size.
        time_budget: Seconds for the whole search: a size whose trial would not end in what
            is left does not fit; "auto": ``CPU_TIME_BUDGET_S`` on CPU, none on CUDA.
        progress: Show each trial as it ends.
    """
    def fraction(x: Any) -> bool:
        return isinstance(x, (int, float)) and 0 <= x < 1

    refuse(("mode", mode, mode in ("largest", "fastest"), "use 'largest' or 'fastest'"),
           ("margin", margin, fraction(margin), "use a fraction in [0, 1), e.g. 0.1 for 10% "
            "headroom"),
           ("start", start, whole(start, 1) and whole(max_size, 1) and start <= max_size,
            f"use an int with 1 <= start <= max_size ({max_size!r})"),
           ("steps", steps, whole(steps, 1), "use an int >= 1"),
           ("loader_prefetch", loader_prefetch, whole(loader_prefetch, 1), "use an int >= 1"),
           ("loader_workers", loader_workers, loader_workers is None or whole(loader_workers),
            "use an int >= 0, or None for the loader's default"),
           ("resolution", resolution, fraction(resolution), "use a fraction in [0, 1), e.g. 1/32"),
           ("memory_budget", memory_budget, memory_budget is None or whole(memory_budget, 1),
            "use a positive int number of bytes"),
           ("time_budget", time_budget, time_budget in (None, "auto") or (
               isinstance(time_budget, (int, float)) and time_budget > 0),
            "use seconds > 0, None or 'auto'"))
    params = list(model.parameters())
    dev = torch.device(device) if device is not None else \
        (params[0].device if params else torch.device("cpu"))
    make_batch, per_sample = _batch_source(sample_batch_fn_or_source, dev, max_size,
                                           loader_options)
    budget = memory_budget if memory_budget is not None or dev.type == "cuda" \
        else int(host_available_bytes() * CPU_MEMORY_SHARE)
    seconds = (None if dev.type == "cuda" else CPU_TIME_BUDGET_S) if time_budget == "auto" \
        else time_budget
    saved = tree_map_only(torch.Tensor, lambda t: t.detach().to("cpu", copy=True),  # to restore
                          (model.state_dict(), optimizer.state_dict() if optimizer else None))
    was_training = model.training
    model.train()
    trials = _Trials(model, make_batch, step or default_step, optimizer, amp, dev, steps, budget,
                     clock, seconds, progress)
    try:
        with exact_heap():
            trials.start(start)
            largest = search_batch_size(trials.fits, max_size=max_size, start=start,
                                        resolution=resolution)
    finally:
        model.load_state_dict(saved[0])
        if optimizer is not None:
            optimizer.load_state_dict(saved[1])
        model.train(was_training)
        if trials.host is not None:
            trials.host.stop()
        if trials.bar is not None:
            trials.bar.close()
        free_device_memory(dev)
    if largest == 0:
        first = trials.done[0]
        raise ConfigError(f"find_batch_size: batch size {first.size} does not fit on {dev} "
                          f"({first.note or 'over budget'}); raise memory_budget or shrink the "
                          "model/input")
    res = _choose(trials.done, largest, mode, margin, dev, budget, per_sample,
                  loader_workers, loader_prefetch)
    if any(t.note.startswith("not run: ~") for t in trials.done):
        res = replace(res, reason=res.reason + f"; larger sizes not tried within the "
                      f"{seconds:.0f} s time budget (time_budget=)")
    return replace(res, time_budget_s=seconds)


def _choose(done: list[BatchTrial], largest: int, mode: Mode, margin: float,
            dev: torch.device, budget: int | None, per_sample: int, workers: int | None,
            prefetch: int) -> BatchSizeResult:
    """Pick the size, cap it by the loader's host RAM, and agree on it across ranks."""
    size, why = pick_size(done, largest, mode, margin)
    workers = auto_workers(True) if workers is None else workers
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    ram = ring_bytes(per_sample * size, workers, prefetch) * local
    avail = host_available_bytes()
    room = int(avail * LOADER_RAM_SHARE)
    if per_sample and ram > room:
        per_batch_row = ring_bytes(per_sample, workers, prefetch) * local
        size = max(1, room // per_batch_row)
        why += (f"; capped to {size}: the loader would hold {ram >> 20} MiB of batches, more "
                f"than half the {avail >> 20} MiB of host RAM available")
        warnings.warn(f"find_batch_size: {why}", stacklevel=3)
        ram = ring_bytes(per_sample * size, workers, prefetch) * local
    if per_sample:
        why += (f"; the loader holds ~{ram / 2**20:.1f} MiB of batches at {size} "
                f"({workers} workers × prefetch {prefetch}, {local} local rank(s))")
    agreed = int(_dist_min([float(size)])[0])
    if agreed != size:
        why += f"; {agreed}: the minimum over all ranks"
    log.info("find_batch_size: %s", why)
    return BatchSizeResult(agreed, largest, mode, str(dev), budget, ram, tuple(done), why)
