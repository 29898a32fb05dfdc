"""Where does training time go? ``StallMeter`` splits it into waiting for data versus stepping.

Wrapped around a training loop's loader, it times each ``next(loader)`` (the wait) and the time
from handing the batch out to the next ask (the step); the summary says what share of the steady
state was waiting (:mod:`feedpipe.tools.throughput`'s figures, as bench and tune report them) and
what to change. Two clock reads and three appends per batch (benchmarks/RESULTS.md): cheap
enough to leave on. ``GpuMonitor`` (:mod:`feedpipe.tools.gpumon`) watches the GPU side.
"""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Iterable, Iterator, Literal, TypeVar

from ..errors import BadInputError, ConfigError
from ..loader.config import PREFETCH_DECODE, auto_workers
from ..loader.protocol import Loader
from ..system import usable_cores
from . import refuse
from .findings import dali_hint
from .gpumon import GpuMonitor, GpuStats, GpuSummary
from .throughput import Throughput, of_meter, throughput

T = TypeVar("T")

INPUT_BOUND = 0.30   # waiting more than this fraction of the steady state: input-bound
PARTLY_BOUND = 0.05  # more than this: partly input-bound; below: compute-bound


@dataclass(frozen=True)
class LoaderInfo:
    """What the meter knows about the loader; every field optional. Makes the advice specific."""

    num_workers: int | None = None
    usable_cores: int | None = None
    codec: str | None = None          # stored image codec: "jpeg", "png", "webp", "raw"
    format: str | None = None         # "lmdb", "hdf5", "wds"; None for loose files / unknown
    batch_size: int | None = None
    pin_memory: bool | None = None
    device: str | None = None         # "cuda" or "cpu"
    prefetch_factor: int | None = None
    backend: str | None = None        # "torch", "dali"; None for a plain DataLoader / unknown
    size: tuple[int, int] | None = None  # output images' (H, W), what --resize should store

    @classmethod
    def from_loader(cls, loader: object) -> "LoaderInfo | None":
        """Read a feedpipe loader of either backend (its ``describe()``, the loader protocol) or
        a torch DataLoader; None for anything else."""
        if isinstance(loader, Loader):
            v = loader.describe()
            return cls(usable_cores=usable_cores(), **{f.name: getattr(v, f.name) for f in
                                                       fields(cls) if f.name != "usable_cores"})
        if all(hasattr(loader, a) for a in ("num_workers", "batch_size", "pin_memory", "dataset")):
            return cls(num_workers=loader.num_workers, usable_cores=usable_cores(),  # type: ignore
                       batch_size=loader.batch_size, pin_memory=loader.pin_memory,  # type: ignore
                       prefetch_factor=getattr(loader, "prefetch_factor", None))
        return None


@dataclass(frozen=True)
class StallSummary:
    """Steady-state split of training time into data wait and step, after the first
    ``warmup_batches`` (the rule of :mod:`feedpipe.tools.throughput`); ``samples_per_s``,
    ``input_bound`` and the wait figures are that module's (0 with fewer than 2 batches)."""

    batches: int
    samples: int
    wall_s: float
    first_batch_s: float
    wait_s: float
    step_s: float
    input_bound: float
    wait_p50_ms: float
    wait_p95_ms: float
    wait_p99_ms: float
    samples_per_s: float
    verdict: str
    advice: tuple[str, ...]
    warmup_batches: int = 1

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (advice as a list)."""
        d = asdict(self)
        d["advice"] = list(self.advice)
        return d

    def scalars(self, prefix: str = "feedpipe/") -> dict[str, float]:
        """The figures a trainer's logger plots per epoch ("data time vs train time")."""
        return {f"{prefix}data_wait_share": self.input_bound, f"{prefix}data_wait_s": self.wait_s,
                f"{prefix}step_s": self.step_s, f"{prefix}samples_per_s": self.samples_per_s,
                f"{prefix}wait_p95_ms": self.wait_p95_ms}

    def log_to(self, writer: Any, step: int, prefix: str = "feedpipe/") -> None:
        """Write :meth:`scalars` to a TensorBoard ``SummaryWriter`` (anything with
        ``add_scalar(tag, value, step)``) at ``step``, e.g. the epoch."""
        for tag, value in self.scalars(prefix).items():
            writer.add_scalar(tag, value, step)

    def __str__(self) -> str:
        lines = [f"{self.verdict}: {self.input_bound:.0%} of steady-state time waiting for data "
                 f"({self.batches} batches, {self.samples_per_s:,.0f} samples/s, first batch "
                 f"{self.first_batch_s:.2f} s, wait p50/p95/p99 {self.wait_p50_ms:.1f}/"
                 f"{self.wait_p95_ms:.1f}/{self.wait_p99_ms:.1f} ms)"]
        return "\n".join(lines + [f"  - {a}" for a in self.advice])


def batch_rows(batch: object) -> int:
    """Samples in a batch: first dimension of the first tensor/array value, else 1."""
    if isinstance(batch, dict):
        values: Iterable[object] = batch.values()
    elif isinstance(batch, (tuple, list)):
        values = batch
    else:
        values = (batch,)
    for v in values:
        shape = getattr(v, "shape", None)
        if shape is not None and len(shape) >= 1:
            return int(shape[0])
    return 1


def _cuda_in_use() -> Callable[[], None] | None:
    """``torch.cuda.synchronize`` when this process has initialized CUDA, else None (without
    importing torch: a process that never imported it uses no CUDA through it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.synchronize


class StallMeter:
    """Per-batch data wait vs step timer: ``for batch in meter.wrap(loader): step(batch)``, then
    ``meter.summary()`` (as a context manager, its enter/exit bound ``wall_s``). ``cuda_sync``
    syncs CUDA before each step ends, charging asynchronous GPU work to the step that queued it:
    "auto" when CUDA is in use by the end of the first step, ``True`` always, ``False`` never."""

    def __init__(self, cuda_sync: bool | Literal["auto"] = "auto",
                 clock: Callable[[], float] = time.perf_counter,
                 loader_info: LoaderInfo | None = None) -> None:
        refuse(("clock", clock, callable(clock),
                "pass a function returning seconds, such as time.perf_counter"),
               ("loader_info", loader_info, loader_info is None
                or isinstance(loader_info, LoaderInfo), "pass a feedpipe.tools.monitor."
                "LoaderInfo (LoaderInfo.from_loader(loader)) or None"),
               ("cuda_sync", cuda_sync, cuda_sync in (True, False, "auto"),
                "use 'auto' (sync when CUDA is in use), True or False"))
        self._sync: Callable[[], None] | None = None
        self._auto = cuda_sync == "auto"
        if cuda_sync is True:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("StallMeter(cuda_sync=True) but CUDA is not available here; "
                                  "use cuda_sync='auto' (the default), which syncs only when "
                                  "CUDA is in use", option="cuda_sync")
            self._sync = torch.cuda.synchronize
        self.clock = clock
        self.loader_info = loader_info
        self.reset()

    def reset(self) -> None:
        """Forget every measurement (the loader info is kept)."""
        self.waits: list[float] = []
        self.steps: list[float] = []
        self.rows: list[int] = []  # samples per batch
        self.samples = 0
        self._start: float | None = None
        self._last: float | None = None  # latest wait or step end
        self._end: float | None = None

    def __enter__(self) -> "StallMeter":
        self._start = self.clock()
        return self

    def __exit__(self, *exc: object) -> None:
        self._end = self.clock()

    def wrap(self, loader: Iterable[T]) -> Iterator[T]:
        """Yield ``loader``'s batches, timing the wait for each and the step after it."""
        if self.loader_info is None:
            self.loader_info = LoaderInfo.from_loader(loader)
        clock, waits, steps, rows, sync = self.clock, self.waits, self.steps, self.rows, self._sync
        auto = self._auto and sync is None
        t0 = clock()
        if self._start is None:
            self._start = t0
        it = iter(loader)
        for batch in it:
            self._last = t1 = clock()
            waits.append(t1 - t0)
            rows.append(batch_rows(batch))
            self.samples += rows[-1]
            try:
                yield batch
            except GeneratorExit:  # the loop broke out: this batch's step ended now
                self._last = t0 = clock()
                steps.append(t0 - t1)
                raise
            if auto:  # decided once, after the first step: has it put CUDA to use?
                sync, auto = _cuda_in_use(), False
            if sync is not None:
                sync()
            self._last = t0 = clock()
            steps.append(t0 - t1)

    def record(self, wait_s: float, step_s: float, rows: int) -> None:
        """Add one batch measured elsewhere: a trainer that iterates the loader itself times
        the wait and the step in its batch hooks (:mod:`feedpipe.integrations`)."""
        now = self.clock()
        if self._start is None:
            self._start = now - wait_s - step_s
        self._last = now
        self.waits.append(wait_s)
        self.steps.append(step_s)
        self.rows.append(rows)
        self.samples += rows

    def throughput(self) -> Throughput:
        """The figures of everything measured (at least 2 batches), warm-up from the loader's
        workers: what bench and tune report for the same timings."""
        return of_meter(self, self.workers)

    @property
    def workers(self) -> int | None:
        """The loader's worker count, when known (it sets the warm-up)."""
        return self.loader_info.num_workers if self.loader_info is not None else None

    def summary(self) -> StallSummary:
        """Totals, wait percentiles, verdict and advice for everything measured so far."""
        waits = self.waits
        th = throughput(waits, self.steps, self.rows, self.workers) if len(waits) > 1 else None
        bound = th.wait_fraction if th else 0.0
        end = self._end if self._end is not None else self._last
        wall = (end - self._start) if end is not None and self._start is not None else 0.0
        verdict = ("input-bound" if bound > INPUT_BOUND else
                   "partly input-bound" if bound > PARTLY_BOUND else "compute-bound")
        figures = {k: getattr(th, k, 0.0) for k in ("wait_s", "step_s", "wait_p50_ms",
                                                    "wait_p95_ms", "wait_p99_ms", "samples_per_s")}
        s = StallSummary(batches=len(waits), samples=self.samples, wall_s=wall,
                         first_batch_s=waits[0] if waits else 0.0, input_bound=bound,
                         verdict=verdict, advice=(), warmup_batches=th.warmup_batches if th else 1,
                         **figures)
        return replace(s, advice=advise(s, self.loader_info))


def time_epoch(loader: Iterable[Any], workers: int | None = None) -> Throughput:
    """One pass over ``loader`` (an epoch), timed and rated by :mod:`feedpipe.tools.throughput`;
    ``workers`` defaults to the loader's own (feedpipe loader or torch DataLoader), else 0."""
    if workers is None:
        info = LoaderInfo.from_loader(loader)
        workers = info.num_workers if info is not None else 0
    meter = StallMeter(loader_info=LoaderInfo())
    for _ in meter.wrap(loader):
        pass
    return of_meter(meter, workers)


def stream(loader: Iterable[Any], batches: int | None, epochs: int | None) -> Iterator[Any]:
    """``batches`` batches (epoch after epoch), or ``epochs`` whole epochs, of a feedpipe loader
    or a DataLoader: what bench and tune time."""
    def epochs_forever() -> Iterator[Any]:
        for epoch in itertools.count() if epochs is None else range(epochs):
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            empty = True
            for batch in loader:
                empty = False
                yield batch
            if empty:  # would spin forever on epochs that yield nothing
                raise BadInputError(f"the loader yields no batch in epoch {epoch} (fewer samples "
                                    "than one batch with drop_last?); lower batch_size")

    return itertools.islice(epochs_forever(), batches) if batches is not None else epochs_forever()


def advise(s: StallSummary, info: LoaderInfo | None = None) -> tuple[str, ...]:
    """Concrete changes for a summary, most effective first, as specific as ``info`` allows."""
    out = [] if s.batches >= 20 else [f"only {s.batches} batch(es) measured: measure at least "
                                      "20 for a reliable verdict"]
    i = info or LoaderInfo()
    if not i.device:  # where training runs: "cuda" only where torch can use one
        import torch

        i = replace(i, device="cuda" if torch.cuda.is_available() else "cpu")
    if s.verdict == "compute-bound":
        return (*out, "data keeps up: speed up the step itself (mixed precision, channels_last, "
                "torch.compile, " + ("a larger batch per GPU)" if i.device == "cuda" else
                                     "a larger batch; on CPU, bfloat16 autocast where the CPU "
                                     "supports it)"))
    h, w = i.size or (0, 0)  # convert's --resize for the loader's size: N, or HxW
    resize = (str(h) if h == w else f"{h}x{w}") if h else None
    cores, n, encoded = i.usable_cores, i.num_workers, i.codec != "raw"
    if info is None:
        out.append("more DataLoader workers (one per usable core), or feedpipe's "
                   "`make_loader(..., num_workers='auto')`; pass StallMeter(loader_info=...) for "
                   "specific advice")
    if i.format is None:
        out.append("pack the dataset once (`feedpipe convert imgs/ --to lmdb -o packed/`) and "
                   "load it with feedpipe.make_loader: batched reads instead of a file open and "
                   "a decode setup per sample")
    dali = i.backend == "dali"
    auto = auto_workers(encoded, cores) if cores else None  # what num_workers='auto' picks
    if dali and encoded:
        out.append("the DALI pipeline decodes in its own threads, one per usable core"
                   + (f" ({cores} here)" if cores else "")
                   + (": on CPU that is the limit; run it on a GPU (`make_loader(..., "
                      "device='cuda')`) so nvJPEG decodes" if i.device == "cpu" else
                      f"; more reader processes (num_workers, now {n}) feed it faster"))
    elif n is not None and auto is not None and n != auto:
        what = "one per usable core" if encoded else "what it picks for raw data"
        out.append(f"num_workers={n} " + ("decodes in the training process" if n == 0 and encoded
                                          else "is not what 'auto' picks") +
                   f": `make_loader(..., num_workers='auto')` starts {auto} ({what}, {cores} "
                   "usable cores here)")
    elif encoded and n:
        out.append(f"{n} workers already use all {cores} usable cores: decoding is the "
                   "limit, more workers will not help; give the job more cores or skip "
                   "decoding")
    if not encoded:
        out.append("images are stored raw (no decode): reading and copying bytes is the limit: "
                   "put the dataset on a faster disk or in RAM (page cache), pack it at the "
                   "training resolution (--resize" + (f" {resize}" if resize else "")
                   + ") so fewer bytes are read")
    else:
        out.append("skip decoding at load time: `feedpipe convert ... --store raw --resize "
                   + (f"{resize}`" if resize else "N` (N: your loader's size=)")
                   + " stores decoded uint8 images at the loader's size (several times the "
                   "disk, almost no CPU)")
        if i.device == "cuda" and not dali:
            import torch

            from ..loader.dali.pipeline import dali_installed

            out.append(dali_hint(torch.version.cuda, dali_installed()))
    if i.device == "cuda" and i.pin_memory is False:
        out.append("`make_loader(..., workers=feedpipe.Workers(pin_memory=True))`: host-to-GPU "
                   "copies from pinned memory are faster and overlap with compute")
    step_ms = s.step_s / max(1, s.batches - s.warmup_batches) * 1e3
    if step_ms < 20:
        now = f" (now {i.batch_size})" if i.batch_size else ""
        out.append(f"steps are short ({step_ms:.1f} ms per batch): a larger batch_size{now} "
                   "amortizes the loader's fixed cost per batch")
    if s.wait_p95_ms > 1 and s.wait_p50_ms < 0.25 * s.wait_p95_ms:
        more = 2 * (i.prefetch_factor or PREFETCH_DECODE)
        out.append(f"waits are bursty (p50 {s.wait_p50_ms:.1f} ms, p95 {s.wait_p95_ms:.1f} ms): "
                   f"buffer more batches ahead: `make_loader(..., workers=feedpipe.Workers("
                   f"prefetch_factor={more}))` (now {i.prefetch_factor or 'auto'})")
    if s.wall_s > 0 and s.first_batch_s > 0.2 * s.wall_s:
        out.append(f"start-up (first batch {s.first_batch_s:.1f} s) is "
                   f"{s.first_batch_s / s.wall_s:.0%} of the run: keep one loader across epochs "
                   "(its workers live as long as it does) and measure a longer run")
    return tuple(out)


__all__ = ["GpuMonitor", "GpuStats", "GpuSummary", "LoaderInfo", "StallMeter", "StallSummary",
           "advise", "time_epoch"]
