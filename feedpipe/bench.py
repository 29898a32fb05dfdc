"""``feedpipe bench``: loader throughput on the user's own data, one trial per configuration.

PATH is a packed dataset, or an image folder / CSV / JSONL source, which is first packed (original
JPEG bytes) into a temporary dataset per ``formats`` with the converters' Python API: feedpipe
reads packed data, so that is what a user will train from (``pack_dir`` keeps it). Each trial
(format × backend × workers × batch size) runs ``make_loader`` wrapped in a
:class:`~feedpipe.monitor.StallMeter`; ``baseline=True`` adds a naive ImageFolder-style DataLoader
(workers=0, PIL, default collate) on the loose image files, or on the packed bytes one sample at a
time when the files are gone.

Figures and the JSON schema: :mod:`feedpipe.benchreport`. The CLI adds a progress bar, the
table, ``--json`` and ``--plot``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader

from . import machine
from .baseline import naive_loader, stored_bytes_per_sample
from .benchreport import BenchReport, Trial
from .errors import ConfigError, EmptyDatasetError, FeedpipeError
from .formats import DatasetReader, open_dataset
from .loader import Loader, make_loader
from .loader.config import _DTYPES as DTYPES
from .loader.config import auto_workers, usable_cores
from .manifest import MANIFEST_NAME
from .monitor import LoaderInfo, StallMeter

Progress = Callable[[str, int, int | None], None]  # (stage, done, total)
Workers = int | Literal["auto"]
Backend = Literal["torch", "dali"]


@dataclass(frozen=True)
class BenchConfig:
    """One sweep: every backend × workers × batch size (× format, for folder input)."""

    backends: tuple[Backend, ...] = ("torch",)
    workers: tuple[Workers, ...] | None = None  # None: 0 and powers of two up to usable cores
    batch_sizes: tuple[int, ...] = (64,)
    batches: int | None = 50
    epochs: int | None = None
    device: str = "cpu"
    size: int = 224
    dtype: str = "float32"
    step_ms: float = 0.0
    step_kind: Literal["sleep", "busy"] = "sleep"
    baseline: bool = False
    formats: tuple[str, ...] = ("lmdb",)
    limit: int | None = None
    pack_dir: Path | None = None
    seed: int = 0
    threads: int | None = None  # torch intra-op threads of this process during the run

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ConfigError(msg)

        for name in ("backends", "workers", "batch_sizes", "formats"):
            if isinstance(getattr(self, name), str):
                bad(f"{name}={getattr(self, name)!r}: pass a tuple, e.g. {name}=('a', 'b')")
        if (self.batches is None) == (self.epochs is None):
            bad("give either batches (per trial) or epochs, not both")
        for name, least, why, optional in (
                ("batches", 2, " (the first batch is start-up)", True), ("epochs", 1, "", True),
                ("size", 1, " (output pixels per side)", False), ("seed", 0, "", False),
                ("limit", 1, " (images to pack)", True),
                ("threads", 1, " (None keeps torch's setting)", True)):
            v = getattr(self, name)
            if not (v is None and optional) and (isinstance(v, bool) or not isinstance(v, int)
                                                 or v < least):
                bad(f"{name}={v!r}: use an integer of at least {least}{why}")
        for b in self.backends:
            if b not in ("torch", "dali"):
                bad(f"backend {b!r}: use torch and/or dali")
        for w in self.workers or ():
            if w != "auto" and (isinstance(w, bool) or not isinstance(w, int) or w < 0):
                bad(f"workers {w!r}: use integers >= 0 or 'auto'")
        if not self.batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                       for b in self.batch_sizes):
            bad(f"batch_sizes={self.batch_sizes}: use positive integers")
        if self.device not in ("cpu", "cuda"):
            bad(f"device={self.device!r}: use 'cpu' or 'cuda'")
        if self.device == "cuda" and not torch.cuda.is_available():
            bad("device='cuda' but torch sees no CUDA device here; use device='cpu'")
        if self.dtype not in DTYPES:
            bad(f"dtype={self.dtype!r}: use one of {', '.join(DTYPES)}")
        if isinstance(self.step_ms, bool) or not isinstance(self.step_ms, (int, float)) \
                or not self.step_ms >= 0:
            bad(f"step_ms={self.step_ms!r}: use a number of milliseconds >= 0")
        if self.step_kind not in ("sleep", "busy"):
            bad(f"step_kind={self.step_kind!r}: use 'sleep' (GPU-like) or 'busy' (CPU-bound)")
        if not self.formats or any(f not in ("lmdb", "hdf5", "wds") for f in self.formats):
            bad(f"formats={self.formats}: use lmdb, hdf5 and/or wds")


def sweep_workers(cores: int) -> tuple[int, ...]:
    """Default sweep: 0 and the powers of two up to the usable cores, plus the cores."""
    powers = {2 ** k for k in range(cores.bit_length()) if 2 ** k <= cores}
    return tuple(sorted({0, cores} | powers))


def _stream(loader: Loader | DataLoader, batches: int | None,
            epochs: int | None) -> Iterator[Any]:
    """``batches`` batches (epoch after epoch), or ``epochs`` whole epochs, of a feedpipe loader
    (either backend, through the loader protocol) or the naive baseline's DataLoader."""
    def epochs_forever() -> Iterator[Any]:
        for epoch in itertools.count() if epochs is None else range(epochs):
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            empty = True
            for batch in loader:
                empty = False
                yield batch
            if empty:  # would spin forever on epochs that yield nothing
                raise EmptyDatasetError(f"the loader yields no batch in epoch {epoch} "
                                        "(fewer samples than one batch with drop_last?)")

    return itertools.islice(epochs_forever(), batches) if batches is not None else epochs_forever()


def _step(cfg: BenchConfig, device: torch.device) -> Callable[[Any], None]:
    """The simulated training step: moves naive batches to the device, then sleeps or spins."""
    seconds = cfg.step_ms / 1000

    def step(batch: Any) -> None:
        if device.type == "cuda" and isinstance(batch, (list, tuple)):  # naive: copy it over
            for v in batch:
                v.to(device, non_blocking=True)
        if seconds and cfg.step_kind == "sleep":
            time.sleep(seconds)
        elif seconds:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
    return step


def measure(loader: Loader | DataLoader, cfg: BenchConfig, base: Trial, bytes_per_sample: float,
            info: LoaderInfo | None, progress: Progress | None = None) -> Trial:
    """Run one trial: the loader through the meter and the step, resources sampled meanwhile."""
    device = torch.device(cfg.device)
    step = _step(cfg, device)
    total = cfg.batches if cfg.batches is not None else cfg.epochs * len(loader)  # type: ignore
    meter = StallMeter(cuda_sync=device.type == "cuda", loader_info=info)
    first = 0
    with machine.ProcessTreeSampler() as res:
        for i, batch in enumerate(meter.wrap(_stream(loader, cfg.batches, cfg.epochs))):
            if i == 0:
                first = meter.samples
            step(batch)
            if progress:
                progress(f"{base.label} workers {base.workers_requested}", i + 1, total)
    s = meter.summary()
    steady = s.wait_s + s.step_s
    rate = (s.samples - first) / steady if steady > 0 else 0.0
    return replace(base, samples=s.samples, batches=s.batches, wall_s=s.wall_s,
                   first_batch_s=s.first_batch_s, samples_per_s=rate,
                   bytes_per_sample=bytes_per_sample, mb_per_s=rate * bytes_per_sample / 1e6,
                   wait_fraction=s.input_bound, wait_p50_ms=s.wait_p50_ms,
                   wait_p95_ms=s.wait_p95_ms, wait_p99_ms=s.wait_p99_ms,
                   peak_rss_main_mb=res.peak_main / 2**20,
                   peak_rss_workers_mb=res.peak_workers / 2**20,
                   cpu_util=res.cpu_s / res.wall / usable_cores() if res.wall > 0 else 0.0,
                   stall=s.to_dict())


def is_packed(path: Path) -> bool:
    """A packed dataset (or a train/val split of one) rather than an image source."""
    return (path / MANIFEST_NAME).is_file() or (path / "train" / MANIFEST_NAME).is_file()


def prepare(path: Path, cfg: BenchConfig, workdir: Path,
            progress: Progress | None = None) -> tuple[dict[str, Path], dict[str, Any], Any]:
    """Resolve PATH to packed datasets {format: path}, a dataset description and its source.

    A folder (or CSV/JSONL source) is packed into ``cfg.pack_dir`` or ``workdir`` once per format;
    ``limit`` keeps that many images, evenly spaced over the sorted source.
    """
    from converters import convert, scan

    if is_packed(path):
        reader = open_dataset(path)
        reader.require_samples("feedpipe bench")
        if "image" not in reader.schema:
            raise ConfigError(f"{path}: bench measures image datasets; this one has no 'image' "
                              f"field ({reader.schema.names})")
        return {reader.format_name: path}, {
            "path": str(path), "kind": "packed", "format": reader.format_name,
            "samples": len(reader), "codec": getattr(reader.schema["image"], "codec", None)}, None
    src = scan(path)
    if not src.items:
        raise ConfigError(f"{path}: neither a packed feedpipe dataset (no {MANIFEST_NAME}) nor a "
                          "source with images; pass a `feedpipe convert` output or an image folder")
    if cfg.limit and cfg.limit < len(src.items):
        keep = np.linspace(0, len(src.items) - 1, cfg.limit).round().astype(int)
        src = replace(src, items=tuple(src.items[i] for i in keep))
    root = cfg.pack_dir or workdir
    packed, info = {}, {}
    for fmt in cfg.formats:
        cb = (lambda d, t, fmt=fmt: progress(f"pack {fmt}", d, t)) if progress else None
        res = convert(src, Path(root) / fmt, to=fmt, overwrite=True, progress=cb)
        packed[fmt] = res.out
        info[fmt] = {"path": str(res.out), "seconds": res.seconds, "images": res.written,
                     "skipped": res.skipped, "kept": cfg.pack_dir is not None}
    return packed, {"path": str(path), "kind": "folder", "format": None, "samples": len(src.items),
                    "codec": None, "packed": info}, src


def run_bench(path: str | Path, cfg: BenchConfig = BenchConfig(),
              progress: Progress | None = None) -> BenchReport:
    """Measure every configuration of ``cfg`` on PATH; see the module docstring for the figures."""
    if not isinstance(cfg, BenchConfig):
        raise ConfigError(f"cfg={cfg!r}: pass a feedpipe.bench.BenchConfig(...)")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such dataset or image folder")
    torch.manual_seed(cfg.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads or threads)
    workdir = Path(tempfile.mkdtemp(prefix="feedpipe-bench-"))
    try:
        packed, dataset, src = prepare(path, cfg, workdir, progress)
        trials = []
        for fmt, bs, backend in itertools.product(packed, cfg.batch_sizes, cfg.backends):
            trials += _trials(packed[fmt], fmt, bs, backend, cfg, progress)
        baseline = None
        if cfg.baseline:
            baseline = _baseline(open_dataset(next(iter(packed.values()))), src, cfg, progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        torch.set_num_threads(threads)
    ok = [t for t in trials if t.status == "ok"]
    if ok:
        top = max(ok, key=lambda t: t.samples_per_s)
        trials = [replace(t, best=True) if t is top else t for t in trials]
    desc = machine.describe()
    desc["torch_threads"] = cfg.threads or threads
    return BenchReport(dataset, cfg, desc, tuple(trials), baseline,
                       datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _trials(path: Path, fmt: str, bs: int, backend: str, cfg: BenchConfig,
            progress: Progress | None) -> list[Trial]:
    """The worker sweep of one format × batch size × backend; 'auto' merged with its value."""
    reader = open_dataset(path)
    image = reader.schema["image"] if "image" in reader.schema else None
    decodes = image is not None and getattr(image, "codec", "raw") != "raw"
    auto = auto_workers(decodes)
    requested: dict[int, list[str]] = {}
    for w in cfg.workers or sweep_workers(usable_cores()):
        requested.setdefault(auto if w == "auto" else int(w), []).append(str(w))
    out = []
    for workers, names in requested.items():
        label = f"{workers} (auto)" if "auto" in names else str(workers)
        base = Trial(fmt, backend, bs, label, workers)
        try:
            loader = make_loader(reader, bs, backend=backend, num_workers=workers, size=cfg.size,
                                 crop="center_crop", dtype=cfg.dtype, device=cfg.device,
                                 seed=cfg.seed)
        except (ImportError, FeedpipeError) as exc:
            if backend == "torch":
                raise
            sweep = ",".join(n for ns in requested.values() for n in ns)
            return out + [replace(base, workers_requested=sweep, workers=None,
                                  status="unavailable", reason=str(exc))]
        out.append(measure(loader, cfg, base, stored_bytes_per_sample(reader),
                           LoaderInfo.from_loader(loader), progress))
        del loader
        gc.collect()  # shut the persistent workers down before the next trial
    return out


def _baseline(reader: DatasetReader, src: Any, cfg: BenchConfig,
              progress: Progress | None) -> Trial:
    """The naive DataLoader (see :mod:`feedpipe.baseline`) at the first batch size."""
    bs = cfg.batch_sizes[0]
    loader, what, nbytes = naive_loader(
        reader, src.items if src is not None else None, batch_size=bs, size=cfg.size,
        samples=cfg.batches * bs if cfg.batches else None, seed=cfg.seed)
    base = Trial("loose" if what == "loose files" else reader.format_name, "DataLoader", bs, "0",
                 0, source=what)
    return measure(loader, cfg, base, nbytes, LoaderInfo.from_loader(loader), progress)


def _list(text: str, kind: type, what: str) -> tuple[Any, ...]:
    """'0,2,auto' -> (0, 2, 'auto'); a bad item names the option and what to write instead."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        try:
            out.append(item if item == "auto" and what == "--workers" else kind(item))
        except ValueError:
            example = "0,2,auto" if what == "--workers" else "64,128"
            raise ConfigError(f"{what} {text!r}: {item!r} is not a valid value; use a "
                              f"comma-separated list such as {example}") from None
    return tuple(out)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the sweep with a progress bar (stderr); print the table; write --json / --plot."""
    from tqdm import tqdm

    from .benchreport import check_output_path, figure_class, format_table, plot_report
    from .paths import write_atomic

    for option, out in (("--json", args.json), ("--plot", args.plot)):
        if out is not None:  # before the run, not after minutes of it
            check_output_path(out, option)
    if args.plot:
        figure_class()
    cfg = BenchConfig(
        backends=tuple(args.backend.split(",")),  # type: ignore[arg-type]
        batch_sizes=_list(args.batch_size, int, "--batch-size"),
        workers=_list(args.workers, int, "--workers") if args.workers else None,
        batches=None if args.epochs else args.batches, epochs=args.epochs, device=args.device,
        size=args.size, dtype=args.dtype, step_ms=args.step_ms, step_kind=args.step_kind,
        baseline=args.baseline, formats=tuple(args.formats.split(",")), limit=args.limit,
        pack_dir=args.pack_dir, seed=args.seed, threads=args.threads)
    bars: dict[str, Any] = {}

    def progress(stage: str, done: int, total: int | None) -> None:
        if stage not in bars:
            for b in bars.values():
                b.close()
            bars.clear()
            bars[stage] = tqdm(total=total, desc=stage, unit="batch" if "pack" not in stage
                               else "img", leave=False, disable=args.quiet or None, file=sys.stderr)
        bar = bars[stage]
        bar.total = total
        bar.update(done - bar.n)

    try:
        report = run_bench(args.path, cfg, progress)
    finally:
        for b in bars.values():
            b.close()
    for fmt, p in report.dataset.get("packed", {}).items():
        where = f"kept in {p['path']}" if p["kept"] else "temporary, removed; --pack-dir keeps it"
        print(f"packed {p['images']} images of {args.path} into {fmt} in {p['seconds']:.1f} s "
              f"({where}); the trials read that")
        if p["skipped"]:
            first = p["skipped"][0]
            print(f"  skipped {len(p['skipped'])} unreadable input(s), not benchmarked; first: "
                  f"{first['path']}: {first['reason']}")
    print(format_table(report))
    if args.json:
        write_atomic(args.json, json.dumps(report.to_json(), indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {plot_report(report, args.plot)}")
    return 0


def register(sub: Any) -> None:
    """Add the ``bench`` subcommand to the ``feedpipe`` CLI's subparsers."""
    b = sub.add_parser("bench", help="measure loader throughput on your data, per configuration")
    b.add_argument("path", type=Path, help="packed dataset, or image folder (packed first into a "
                   "temporary dataset per --formats)")
    b.add_argument("--backend", default="torch", help="comma-separated: torch,dali")
    b.add_argument("--workers", help="comma-separated num_workers, e.g. 0,2,4,auto (default: 0 "
                   "and powers of two up to the usable cores)")
    b.add_argument("--batch-size", default="64", help="comma-separated, e.g. 64,128")
    n = b.add_mutually_exclusive_group()
    n.add_argument("--batches", type=int, default=50, help="batches per trial (default 50)")
    n.add_argument("--epochs", type=int, help="whole epochs per trial instead of --batches")
    b.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    b.add_argument("--size", type=int, default=224, help="output HxW (center crop)")
    b.add_argument("--dtype", default="float32", choices=DTYPES)
    b.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated training step per batch; reports the share of time waiting")
    b.add_argument("--step-kind", default="sleep", choices=["sleep", "busy"],
                   help="sleep (a GPU step: CPU free) or busy (a CPU-bound step)")
    b.add_argument("--baseline", action="store_true",
                   help="also run a default DataLoader (workers=0, PIL) on the loose images")
    b.add_argument("--formats", default="lmdb", help="folder input: formats to pack and compare")
    b.add_argument("--limit", type=int, help="folder input: pack only N images (evenly spaced)")
    b.add_argument("--pack-dir", type=Path, help="folder input: keep the packed data here")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--threads", type=int, help="torch threads of the training process during "
                   "the run (default: torch's own setting, recorded in --json)")
    b.add_argument("--json", type=Path, help="write every figure + the machine to this file")
    b.add_argument("--plot", type=Path, help="write a PNG: samples/s vs workers (matplotlib)")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=cmd_bench)
