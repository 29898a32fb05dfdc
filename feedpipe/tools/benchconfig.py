"""What one ``feedpipe bench`` sweep runs (:class:`BenchConfig`), checked when made; apart from
:mod:`feedpipe.tools.bench`, which runs it, so that the report (:mod:`.benchreport`) names it
without importing the runner."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ..errors import ConfigError
from ..loader.config import _DTYPES as DTYPES

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
        def bad(option: str, how: str) -> None:
            raise ConfigError(f"{option}={getattr(self, option)!r}: {how}", option=option)

        for name in ("backends", "workers", "batch_sizes", "formats"):
            if isinstance(getattr(self, name), str):
                bad(name, f"pass a tuple, e.g. {name}=('a', 'b')")
        if (self.batches is None) == (self.epochs is None):
            raise ConfigError("give either batches (per trial) or epochs, not both",
                              option="batches")
        for name, least, why, optional in (
                ("batches", 2, " (the first batch is start-up)", True), ("epochs", 1, "", True),
                ("size", 1, " (output pixels per side)", False), ("seed", 0, "", False),
                ("limit", 1, " (images to pack)", True),
                ("threads", 1, " (None keeps torch's setting)", True)):
            v = getattr(self, name)
            if not (v is None and optional) and (isinstance(v, bool) or not isinstance(v, int)
                                                 or v < least):
                bad(name, f"use an integer of at least {least}{why}")
        for b in self.backends:
            if b not in ("torch", "dali"):
                raise ConfigError(f"backend {b!r}: use torch and/or dali", option="backends")
        for w in self.workers or ():
            if w != "auto" and (isinstance(w, bool) or not isinstance(w, int) or w < 0):
                raise ConfigError(f"workers {w!r}: use integers >= 0 or 'auto'", option="workers")
        if not self.batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                       for b in self.batch_sizes):
            bad("batch_sizes", "use positive integers")
        if self.device not in ("cpu", "cuda"):
            bad("device", "use 'cpu' or 'cuda'")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device='cuda' but torch sees no CUDA device here; use device='cpu'",
                              option="device")
        if self.dtype not in DTYPES:
            bad("dtype", f"use one of {', '.join(DTYPES)}")
        if isinstance(self.step_ms, bool) or not isinstance(self.step_ms, (int, float)) \
                or not self.step_ms >= 0:
            bad("step_ms", "use a number of milliseconds >= 0")
        if self.step_kind not in ("sleep", "busy"):
            bad("step_kind", "use 'sleep' (GPU-like) or 'busy' (CPU-bound)")
        if not self.formats or any(f not in ("lmdb", "hdf5", "wds") for f in self.formats):
            bad("formats", "use lmdb, hdf5 and/or wds")
