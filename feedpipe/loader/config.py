"""LoaderConfig: every ``make_loader`` option in one frozen, validated object.

Bad values are rejected up front with a message that says how to fix them; "auto" values are
resolved once by :meth:`LoaderConfig.resolve` against the machine and the dataset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Literal

from ..errors import ConfigError

Crop = Literal["resize", "center_crop", "random_resized_crop", "none"]
Backend = Literal["auto", "torch", "dali"]
DaliReader = Literal["plan", "webdataset"]
OnError = Literal["raise", "skip"]
DecodeOn = Literal["auto", "cpu", "device"]
Auto = Literal["auto"]
Tune = Literal["tune"]  # measured by make_loader through feedpipe.tune.autotune

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_DTYPES = ("float32", "float16", "bfloat16", "uint8")


@dataclass(frozen=True)
class LoaderConfig:
    """What to load, how to augment it, where to put it, and how to parallelize."""

    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    uneven: Literal["pad", "drop"] = "pad"
    fields: tuple[str, ...] | None = None
    size: tuple[int, int] | None = None
    crop: Crop = "center_crop"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    device: str = "auto"
    dtype: str = "float32"
    mean: tuple[float, float, float] | None = IMAGENET_MEAN
    std: tuple[float, float, float] | None = IMAGENET_STD
    channels_last: bool = True
    backend: Backend = "auto"
    dali_reader: DaliReader = "plan"   # "webdataset": DALI's own tar reader (its order; opt-in)
    dali_hw_decoder_load: float = 0.65  # share of JPEGs for the A100/H100 hardware decoder
    decode_on: DecodeOn = "auto"
    num_workers: int | Auto | Tune = "auto"
    prefetch_factor: int | Auto = "auto"
    pin_memory: bool | Auto = "auto"
    persistent_workers: bool | Auto = "auto"
    multiprocessing_context: str | None = None
    shuffle_buffer: int = 1000
    on_error: OnError = "raise"
    max_pixels: int | None = None  # None: the dataset's recorded limit, else DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ConfigError(msg)

        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            bad(f"batch_size={self.batch_size!r}: use a positive integer")
        if not isinstance(self.seed, int) or self.seed < 0:
            bad(f"seed={self.seed!r}: use a non-negative integer")
        if self.uneven not in ("pad", "drop"):
            bad(f"uneven={self.uneven!r}: use 'pad' (wrap around so every rank gets the same "
                "count) or 'drop' (trim to the shortest rank)")
        if self.size is not None:
            size = (self.size, self.size) if isinstance(self.size, int) else tuple(self.size)
            if len(size) != 2 or any(not isinstance(s, int) or s < 1 for s in size):
                bad(f"size={self.size!r}: use an int (square) or (height, width) of positive ints")
            object.__setattr__(self, "size", size)
        if self.crop not in ("resize", "center_crop", "random_resized_crop", "none"):
            bad(f"crop={self.crop!r}: use 'resize', 'center_crop', 'random_resized_crop' or 'none'")
        lo, hi = self.scale
        if not 0 < lo <= hi <= 1:
            bad(f"scale={self.scale!r}: use 0 < min <= max <= 1 (fractions of the image area)")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            bad(f"ratio={self.ratio!r}: use 0 < min <= max (width / height)")
        if self.dtype not in _DTYPES:
            bad(f"dtype={self.dtype!r}: use one of {', '.join(_DTYPES)}")
        for name in ("mean", "std"):
            v = getattr(self, name)
            if v is not None:
                v = tuple(float(x) for x in v)
                if len(v) != 3:
                    bad(f"{name}={v!r}: give three per-channel values (RGB, in 0..1 units)")
                object.__setattr__(self, name, v)
        if (self.mean is None) != (self.std is None):
            bad("mean and std go together: pass both, or mean=None, std=None for no normalization")
        if self.std is not None and any(s <= 0 for s in self.std):
            bad(f"std={self.std!r}: values must be positive")
        if self.backend not in ("auto", "torch", "dali"):
            bad(f"backend={self.backend!r}: use 'auto', 'torch' or 'dali'")
        if self.dali_reader not in ("plan", "webdataset"):
            bad(f"dali_reader={self.dali_reader!r}: use 'plan' (feedpipe's order, every format) "
                "or 'webdataset' (DALI's native tar reader and order, WebDataset only)")
        if not 0.0 <= self.dali_hw_decoder_load <= 1.0:
            bad(f"dali_hw_decoder_load={self.dali_hw_decoder_load!r}: use a fraction in [0, 1]")
        if self.decode_on not in ("auto", "cpu", "device"):
            bad(f"decode_on={self.decode_on!r}: use 'cpu' (workers decode), 'device' (nvJPEG on "
                "the CUDA device through torchvision) or 'auto' (device when it can)")
        if self.num_workers not in ("auto", "tune") and (not isinstance(self.num_workers, int)
                                                         or self.num_workers < 0):
            bad(f"num_workers={self.num_workers!r}: use 'auto', 'tune' (measured trials, cached) "
                "or an int >= 0 (0 loads in the main process)")
        if self.prefetch_factor != "auto" and (not isinstance(self.prefetch_factor, int)
                                               or self.prefetch_factor < 1):
            bad(f"prefetch_factor={self.prefetch_factor!r}: use 'auto' or an int >= 1")
        if self.on_error not in ("raise", "skip"):
            bad(f"on_error={self.on_error!r}: use 'raise' or 'skip' (count and refill)")
        if self.shuffle_buffer < 1:
            bad(f"shuffle_buffer={self.shuffle_buffer}: use a positive sample count")
        if self.max_pixels is not None and (not isinstance(self.max_pixels, int)
                                            or self.max_pixels < 1):
            bad(f"max_pixels={self.max_pixels!r}: use a positive pixel count (width x height) "
                "or None for the dataset's own limit")
        if self.fields is not None:
            object.__setattr__(self, "fields", tuple(self.fields))
        ctx = self.multiprocessing_context
        if ctx is not None and ctx not in ("fork", "spawn", "forkserver"):
            bad(f"multiprocessing_context={ctx!r}: use 'fork', 'spawn' or 'forkserver'")

    def resolve(self, *, cuda: bool, decodes: bool) -> "LoaderConfig":
        """Replace every "auto" with a concrete value (see :func:`auto_workers`)."""
        if self.num_workers == "tune":
            raise ConfigError("num_workers='tune' is measured by make_loader (feedpipe.tune."
                              "autotune) before resolve(); call make_loader, or autotune first")
        workers = auto_workers(decodes) if self.num_workers == "auto" else self.num_workers
        return replace(
            self,
            num_workers=workers,
            prefetch_factor=(4 if decodes else 2) if self.prefetch_factor == "auto"
            else self.prefetch_factor,
            pin_memory=cuda if self.pin_memory == "auto" else self.pin_memory,
            persistent_workers=workers > 0 if self.persistent_workers == "auto"
            else self.persistent_workers,
        )


def usable_cores() -> int:
    """Cores this process may run on (affinity / cgroup cpusets), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def auto_workers(decodes: bool, cores: int | None = None, local_procs: int | None = None) -> int:
    """The ``num_workers="auto"`` heuristic.

    Usable cores are shared among the local data-parallel processes (``LOCAL_WORLD_SIZE``, one
    per local GPU under torchrun). Decoding is CPU-bound, so each process gets one worker per
    core of its share (the main process mostly waits on the queue and copies to the device).
    Raw, decode-free data is memory-bound and loads fastest in the main process (0 workers):
    zero-copy reads plus one copy per sample beat shipping each batch through worker shared
    memory, whose fresh pages cost more than the copy (benchmarks/bench_loader.py).
    """
    cores = cores or usable_cores()
    local = local_procs or int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    share = max(1, cores // max(1, local))
    return share if decodes else 0
