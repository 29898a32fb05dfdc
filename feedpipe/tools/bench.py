"""``feedpipe bench``: loader throughput on the user's own data, one trial per configuration.

PATH is a packed dataset, a dataset URL (read through the node-local cache as ``make_loader``
reads it; the storage options stay out of the report), or an image folder / CSV / JSONL source,
first packed (JPEG bytes unchanged) per ``formats``: packed data is what a user trains from. Each
trial (format × backend × workers × batch size) runs ``make_loader`` inside a
:class:`~feedpipe.tools.monitor.StallMeter`; ``baseline=True`` adds the default and the tuned
DataLoader (:mod:`feedpipe.tools.baseline`). The report: :mod:`feedpipe.tools.benchreport`.
"""

from __future__ import annotations

import gc
import itertools
import shutil
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..dataset.manifest import MANIFEST_NAME, refuse_url
from ..dataset.registry import DatasetReader, open_dataset
from ..errors import ConfigError, FeedpipeError
from ..loader.api import Loader, make_loader
from ..loader.config import Output, auto_workers
from ..storage import is_remote, local_path
from ..system import usable_cores
from . import machine
from .baseline import naive_loader, stored_bytes_per_sample
from .benchreport import BenchConfig, BenchReport
from .monitor import LoaderInfo, StallMeter, stream
from .rss import ProcessTreeSampler
from .throughput import Trial, of_meter

Progress = Callable[[str, int, int | None], None]  # (stage, done, total)


def sweep_workers(cores: int) -> tuple[int, ...]:
    """Default sweep: 0 and the powers of two up to the usable cores, plus the cores."""
    powers = {2 ** k for k in range(cores.bit_length()) if 2 ** k <= cores}
    return tuple(sorted({0, cores} | powers))


def measure(loader: Loader | DataLoader, cfg: BenchConfig, base: Trial, bytes_per_sample: float,
            info: LoaderInfo | None, progress: Progress | None = None) -> Trial:
    """Run one trial: the loader through the meter and the simulated step (a DataLoader's
    batches copied to the device first), resources sampled meanwhile; rated as tune rates."""
    device, seconds = torch.device(cfg.device), cfg.step_ms / 1000
    total = cfg.batches if cfg.batches is not None else cfg.epochs * len(loader)  # type: ignore
    meter = StallMeter(cuda_sync=device.type == "cuda", loader_info=info)
    with ProcessTreeSampler() as res:
        for i, batch in enumerate(meter.wrap(stream(loader, cfg.batches, cfg.epochs))):
            if device.type == "cuda" and isinstance(batch, (list, tuple)):  # a DataLoader's
                for v in batch:
                    v.to(device, non_blocking=True)
            if seconds and cfg.step_kind == "sleep":  # the simulated training step
                time.sleep(seconds)
            elif seconds:
                end = time.perf_counter() + seconds
                while time.perf_counter() < end:
                    pass
            if progress:
                progress(f"{base.label} workers {base.workers_requested}", i + 1, total)
    s = meter.summary()
    th = of_meter(meter, base.workers)
    return base.measured(
        th, wall_s=s.wall_s, bytes_per_sample=bytes_per_sample,
        prefetch=info.prefetch_factor if info is not None and base.workers else None,
        mb_per_s=th.samples_per_s * bytes_per_sample / 1e6,
        peak_rss_main_mb=res.peak_main / 2**20, peak_rss_workers_mb=res.peak_workers / 2**20,
        cpu_util=res.cpu_s / res.wall / usable_cores() if res.wall > 0 else 0.0,
        stall={**s.to_dict(), "throughput": th.to_dict(), "waits_s": meter.waits,
               "steps_s": meter.steps, "rows": meter.rows})


def is_packed(path: Path) -> bool:
    """A packed dataset (or a train/val split of one) rather than an image source."""
    return (path / MANIFEST_NAME).is_file() or (path / "train" / MANIFEST_NAME).is_file()


def _packed(reader: DatasetReader, path: str | Path) -> dict[str, Any]:
    """The description of a packed dataset (local or URL) that bench can measure."""
    reader.require_samples("feedpipe bench")
    if "image" not in reader.schema:
        raise ConfigError(f"{path}: bench measures image datasets; this one has no 'image' "
                          f"field ({reader.schema.names})")
    return {"path": str(path), "kind": "packed", "format": reader.format_name,
            "samples": len(reader), "codec": getattr(reader.schema["image"], "codec", None)}


def prepare(path: Path, cfg: BenchConfig, workdir: Path,
            progress: Progress | None = None) -> tuple[dict[str, Path], dict[str, Any], Any]:
    """PATH as packed datasets {format: path}, its description and its source: a source is
    packed into ``cfg.pack_dir`` or ``workdir`` per format (``limit``: that many images, evenly
    spaced)."""
    from converters import convert, scan

    if is_packed(path):
        reader = open_dataset(path)
        return {reader.format_name: path}, _packed(reader, path), None
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


def run_bench(path: str | Path, cfg: BenchConfig = BenchConfig(),  # noqa: B008 (frozen)
              progress: Progress | None = None, *, cache_dir: str | Path | None = None,
              cache_limit: int | str | None = None,
              storage_options: dict[str, Any] | None = None) -> BenchReport:
    """Measure every configuration of ``cfg`` on PATH (a folder, packed dataset or dataset URL,
    read with make_loader's ``cache_dir``, ``cache_limit`` and ``storage_options``)."""
    if not isinstance(cfg, BenchConfig):
        raise ConfigError(f"cfg={cfg!r}: pass a feedpipe.tools.bench.BenchConfig(...)",
                          option="cfg")
    remote: dict[str, Any] = {}
    if is_remote(path):
        remote = {"cache_dir": cache_dir, "cache_limit": cache_limit,
                  "storage_options": storage_options}
    else:
        refuse_url(local_path(path), "the dataset")  # e.g. a Path that dropped a URL's slash
        path = Path(local_path(path))
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such dataset or image folder")
    torch.manual_seed(cfg.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads or threads)
    workdir = Path(tempfile.mkdtemp(prefix="feedpipe-bench-"))
    try:
        if remote:  # a packed dataset in object storage, read through the cache
            reader = open_dataset(path, **remote)
            packed: dict[str, Path | str] = {reader.format_name: str(path)}
            dataset = {**_packed(reader, path), "cache_dir": str(cache_dir) if cache_dir else None,
                       "cache_limit": cache_limit}
            src = None
        else:
            local, dataset, src = prepare(Path(path), cfg, workdir, progress)
            packed = dict(local)
        trials = []
        for fmt, bs, backend in itertools.product(packed, cfg.batch_sizes, cfg.backends):
            trials += _trials(packed[fmt], fmt, bs, backend, cfg, progress, remote)
        baselines = None
        if cfg.baseline:
            baselines = _baselines(open_dataset(next(iter(packed.values())), **remote), src, cfg,
                                   progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        torch.set_num_threads(threads)
    ok = [t for t in trials if t.status == "ok"]
    if ok:
        top = max(ok, key=lambda t: t.samples_per_s)
        trials = [replace(t, best=True) if t is top else t for t in trials]
    desc = machine.describe()
    desc["torch_threads"] = cfg.threads or threads
    return BenchReport(dataset, cfg, desc, tuple(trials), *(baselines or (None, None)),
                       datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _trials(path: Path | str, fmt: str, bs: int, backend: str, cfg: BenchConfig,
            progress: Progress | None, remote: dict[str, Any]) -> list[Trial]:
    """The worker sweep of one format × batch size × backend; 'auto' merged with its value.
    ``remote``: open_dataset's cache and storage options for a URL (else empty)."""
    reader = open_dataset(path, **remote)
    # every dataset bench measures has an image field (_packed checks it)
    auto = auto_workers(getattr(reader.schema["image"], "codec", "raw") != "raw")
    requested: dict[int, list[str]] = {}
    for w in cfg.workers or sweep_workers(usable_cores()):
        requested.setdefault(auto if w == "auto" else int(w), []).append(str(w))
    out = []
    for workers, names in requested.items():
        label = f"{workers} (auto)" if "auto" in names else str(workers)
        base = Trial(fmt, backend, bs, label, workers)
        try:
            loader = make_loader(reader, bs, backend=backend, num_workers=workers, size=cfg.size,
                                 crop="center_crop", output=Output(dtype=cfg.dtype),
                                 device=cfg.device, seed=cfg.seed)
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


def _baselines(reader: DatasetReader, src: Any, cfg: BenchConfig,
               progress: Progress | None) -> tuple[Trial, Trial]:
    """The default DataLoader and the tuned one (:mod:`feedpipe.tools.baseline`), at the first
    batch size; the tuned one runs as many workers as ``num_workers='auto'`` would."""
    bs, out = cfg.batch_sizes[0], []
    for workers in (0, auto_workers(True)):
        loader, what, nbytes = naive_loader(
            reader, src.items if src is not None else None, batch_size=bs, size=cfg.size,
            samples=cfg.batches * bs if cfg.batches else None, seed=cfg.seed, workers=workers)
        base = Trial("loose" if what == "loose files" else reader.format_name, "DataLoader", bs,
                     str(workers), workers, source=what)
        out.append(measure(loader, cfg, base, nbytes, LoaderInfo.from_loader(loader), progress))
        del loader
        gc.collect()  # shut the persistent workers down
    return out[0], out[1]
