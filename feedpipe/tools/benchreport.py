"""What one ``feedpipe bench`` sweep runs (:class:`BenchConfig`, checked when made) and what it
measured: the JSON report, the table and the plot; and the up-front check of the diagnostic
commands' output files. Apart from :mod:`feedpipe.tools.bench`, the runner, so that the CLI
reads a report without importing torch.

JSON (:meth:`BenchReport.to_json`, ``schema_version`` 1) holds ``feedpipe_version``, ``created``
(ISO time, UTC), ``machine`` (:func:`feedpipe.tools.machine.describe`), ``config`` (the BenchConfig),
``dataset`` (path, kind "packed"|"folder", format, codec, samples; for folders ``packed``:
{format: {path, seconds, images, skipped, kept}}), ``trials``, ``baseline`` and
``tuned_baseline`` (the default and the tuned DataLoader; null unless asked for), ``best`` (index
into trials, null if none ran), ``speedup_vs_baseline`` and ``speedup_vs_tuned`` (null without
them).
Each trial holds every :class:`~feedpipe.tools.throughput.Trial` field.
"""

from __future__ import annotations

import io
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from .._version import __version__
from ..errors import ConfigError, MissingDependencyError
from ..loader.config import _DTYPES as DTYPES
from ..paths import write_atomic
from . import refuse, whole
from .findings import versus_baselines
from .machine import summary_line
from .throughput import Trial

SCHEMA_VERSION = 1
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
        c = self
        refuse(*((name, getattr(c, name), not isinstance(getattr(c, name), str),
                  f"pass a tuple, e.g. {name}=('a', 'b')")
                 for name in ("backends", "workers", "batch_sizes", "formats")))
        if (c.batches is None) == (c.epochs is None):
            raise ConfigError("give either batches (per trial) or epochs, not both",
                              option="batches")
        refuse(*((name, getattr(c, name), (optional and getattr(c, name) is None)
                  or whole(getattr(c, name), least), f"use an integer of at least {least}{why}")
                 for name, least, why, optional in (
                     ("batches", 2, " (the first batch is start-up)", True),
                     ("epochs", 1, "", True), ("size", 1, " (output pixels per side)", False),
                     ("seed", 0, "", False), ("limit", 1, " (images to pack)", True),
                     ("threads", 1, " (None keeps torch's setting)", True))),
               ("backends", c.backends, all(b in ("torch", "dali") for b in c.backends),
                "use torch and/or dali"),
               ("workers", c.workers, all(w == "auto" or whole(w) for w in c.workers or ()),
                "use integers >= 0 or 'auto'"),
               ("batch_sizes", c.batch_sizes, bool(c.batch_sizes)
                and all(whole(b, 1) for b in c.batch_sizes), "use positive integers"),
               ("device", c.device, c.device in ("cpu", "cuda"), "use 'cpu' or 'cuda'"),
               ("dtype", c.dtype, c.dtype in DTYPES, f"use one of {', '.join(DTYPES)}"),
               ("step_ms", c.step_ms, not isinstance(c.step_ms, bool)
                and isinstance(c.step_ms, (int, float)) and c.step_ms >= 0,
                "use a number of milliseconds >= 0"),
               ("step_kind", c.step_kind, c.step_kind in ("sleep", "busy"),
                "use 'sleep' (GPU-like) or 'busy' (CPU-bound)"),
               ("formats", c.formats, bool(c.formats)
                and all(f in ("lmdb", "hdf5", "wds") for f in c.formats),
                "use lmdb, hdf5 and/or wds"))
        import torch

        if c.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device='cuda' but torch sees no CUDA device here; use device='cpu'",
                              option="device")


@dataclass(frozen=True)
class BenchReport:
    """Everything one ``run_bench`` measured, and where and how."""

    dataset: dict[str, Any]
    config: BenchConfig
    machine: dict[str, Any]
    trials: tuple[Trial, ...]
    baseline: Trial | None
    tuned: Trial | None
    created: str

    @property
    def best(self) -> Trial | None:
        return next((t for t in self.trials if t.best), None)

    def _over(self, base: Trial | None) -> float | None:
        b = self.best
        return b.samples_per_s / base.samples_per_s if b and base and base.samples_per_s else None

    @property
    def speedup(self) -> float | None:
        """Best trial's samples/s over the default DataLoader's, both from this run."""
        return self._over(self.baseline)

    @property
    def speedup_vs_tuned(self) -> float | None:
        """Best trial's samples/s over the tuned DataLoader's, both from this run."""
        return self._over(self.tuned)

    def to_json(self) -> dict[str, Any]:
        cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.config).items()}
        best = self.best
        return {"schema_version": SCHEMA_VERSION, "feedpipe_version": __version__,
                "created": self.created, "machine": self.machine, "config": cfg,
                "dataset": self.dataset, "trials": [asdict(t) for t in self.trials],
                "baseline": asdict(self.baseline) if self.baseline else None,
                "tuned_baseline": asdict(self.tuned) if self.tuned else None,
                "best": self.trials.index(best) if best else None,
                "speedup_vs_baseline": self.speedup, "speedup_vs_tuned": self.speedup_vs_tuned}


COLUMNS = (f"  {'format':<7}{'backend':<11}{'batch':>5}  {'workers':<9}{'samples/s':>10}"
           f"{'MB/s':>9}{'1st s':>7} {'wait p50/p95/p99 ms':>21}{'waiting':>8}"
           f"{'RSS MiB main/wrk':>18}{'CPU':>6}")


def _row(t: Trial) -> str:
    head = f"{'*' if t.best else ' '} {t.format:<7}{t.backend:<11}{t.batch_size:>5}  " \
           f"{t.workers_requested:<9}"
    if t.status != "ok":
        return f"{head}unavailable: {t.reason}"
    waits = f"{t.wait_p50_ms:.1f}/{t.wait_p95_ms:.1f}/{t.wait_p99_ms:.1f}"
    rss = f"{t.peak_rss_main_mb:,.0f}/{t.peak_rss_workers_mb:,.0f}"
    return (f"{head}{t.samples_per_s:>10,.0f}{t.mb_per_s:>9,.1f}{t.first_batch_s:>7.2f} "
            f"{waits:>21}{t.wait_fraction:>8.0%}{rss:>18}{t.cpu_util:>6.0%}")


def format_table(r: BenchReport) -> str:
    """The human report: context, one row per trial (best marked *), baseline, the verdict."""
    cfg, ds = r.config, r.dataset
    what = ", ".join(str(v) for v in (ds.get("format"), ds.get("codec")) if v)
    steps = (f"{cfg.batches} batches" if cfg.batches else f"{cfg.epochs} epoch(s)") + " per trial"
    if cfg.step_ms:
        steps += f", a simulated {cfg.step_ms:g} ms training step ({cfg.step_kind}) per batch"
    lines = [f"dataset: {ds['path']} ({what + ', ' if what else ''}{ds['samples']} samples)",
             f"machine: {summary_line(r.machine)}",
             f"output {cfg.size}x{cfg.size} {cfg.dtype} on {cfg.device}; {steps}", "", COLUMNS]
    lines += [_row(t) for t in r.trials]
    for base, what in ((r.baseline, "default"), (r.tuned, "tuned")):
        if base:
            lines.append(_row(base) + f"   <- {what} DataLoader on {base.source}")
    best = r.best
    lines.append("")
    if best:
        lines.append(f"best: {best.format} {best.backend}, batch {best.batch_size}, workers "
                     f"{best.workers_requested}: {best.samples_per_s:,.0f} samples/s")
        if versus := versus_baselines(r):
            lines.append(f"the best runs at {versus}")
        if cfg.step_ms:
            lines.append(f"with a {cfg.step_ms:g} ms step it waits for data "
                         f"{best.wait_fraction:.0%} of the time ({best.stall.get('verdict')})")
    lines.append("samples/s and waits: steady state after the first batch (1st s: time to first "
                 "batch); MB/s: stored bytes read; waiting: share of time waiting for data; "
                 f"CPU: process-tree CPU time / wall / {r.machine['cores_usable']} usable cores")
    return "\n".join(lines)


def check_output_path(path: Path, option: str) -> None:
    """Fail before a long run rather than after it: ``path``'s folder must exist, ``path`` must
    not be a folder."""
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; give a file name inside it")
    if not path.parent.is_dir():
        raise ConfigError(f"{option} {path}: the folder {path.parent} does not exist; create it "
                          "or write elsewhere")


def figure_class() -> type:
    """matplotlib's ``Figure``, or a MissingDependencyError with the install hint."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError("--plot needs matplotlib: pip install 'feedpipe[plot]'"
                                     ) from exc
    return Figure


def plot_report(r: BenchReport, path: str | Path) -> Path:
    """Samples/s vs workers, one line per format/backend/batch size, baseline and best marked;
    written atomically as a PNG."""
    fig = figure_class()(figsize=(8, 5), dpi=120)
    ax = fig.add_subplot()
    lines: dict[str, list[Trial]] = {}
    for t in r.trials:
        if t.status == "ok":
            lines.setdefault(t.label, []).append(t)
    for label, ts in lines.items():
        ts.sort(key=lambda t: t.workers or 0)
        ax.plot([t.workers for t in ts], [t.samples_per_s for t in ts], marker="o", label=label)
    for base, what, ls in ((r.baseline, "default", "--"), (r.tuned, "tuned", ":")):
        if base:
            ax.axhline(base.samples_per_s, ls=ls, color="0.4", label=f"{what} DataLoader, "
                       f"workers={base.workers} ({base.samples_per_s:,.0f}/s)")
    best = r.best
    if best:
        text = f"best: {best.samples_per_s:,.0f} samples/s"
        text += f"\n{textwrap.fill(versus_baselines(r), 44)}" if r.speedup else ""
        rightmost = best.workers == max(t.workers or 0 for t in r.trials)
        ax.annotate(text, (best.workers, best.samples_per_s),
                    xytext=(-30 if rightmost else 30, -80),
                    textcoords="offset points", ha="right" if rightmost else "left", fontsize=9,
                    arrowprops={"arrowstyle": "->", "color": "0.3"},
                    bbox={"boxstyle": "round", "fc": "white", "ec": "0.7"})
    xs = sorted({t.workers for t in r.trials if t.workers is not None})
    ax.set_xticks(xs or [0])
    rates = [t.samples_per_s or 0.0 for t in r.trials]  # a skipped trial has no rate
    rates += [b.samples_per_s or 0.0 for b in (r.baseline, r.tuned) if b]
    ax.set_ylim(bottom=0, top=max([*rates, 1.0]) * 1.15)
    ax.set_xlabel("DataLoader workers (num_workers)")
    ax.set_ylabel("samples/s (steady state)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    cfg, ds = r.config, r.dataset
    name = Path(ds["path"]).name or ds["path"]
    ax.set_title(f"feedpipe bench: {name} ({ds['samples']} samples, {cfg.size}x{cfg.size} "
                 f"{cfg.dtype} on {cfg.device})\n{summary_line(r.machine)}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    out = Path(path)
    write_atomic(out, buf.getvalue())
    return out
