"""LoaderConfig: every ``make_loader`` option, its groups (``loader/options.py``) flattened, in
one frozen, validated object.

Bad values are rejected up front with a message that says how to fix them; "auto" values are
resolved once by :meth:`LoaderConfig.resolve` against the machine and the dataset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from functools import cache
from typing import Any, Callable, Container, Literal, get_args, get_type_hints

from ..checks import conforms, describe
from ..errors import ConfigError
from ..storage.cache import parse_limit
from ..system import usable_cores as usable_cores  # re-exported: loader.api names it
from .affine_params import RandomAffine

Crop = Literal["resize", "center_crop", "random_resized_crop", "none"]
Backend = Literal["auto", "torch", "dali"]
DaliReader = Literal["plan", "webdataset"]
OnError = Literal["raise", "skip"]
DecodeOn = Literal["auto", "cpu", "device"]
Dtype = Literal["float32", "float16", "bfloat16", "uint8"]
Uneven = Literal["pad", "drop", "mask"]
MpContext = Literal["fork", "spawn", "forkserver"]
Ragged = Literal["pad", "list"]  # boxes and variable-shape arrays: see loader/labels.py
Auto = Literal["auto"]
MixClasses = Literal["equal", "union"]

_DTYPES = get_args(Dtype)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_FIELDS = ("image", "label")  # what a loader yields when ``fields`` is not given
RAW_WORKERS = 2  # "auto" workers for decode-free data: memory-bound, more were not measured
PREFETCH_DECODE = 4  # batches each worker keeps ahead when it decodes ("auto"; 2 when it does not)

# How to fix a bad value, for options whose accepted values need more than their type to explain.
_HOW = {
    "batch_size": "use a positive integer",
    "seed": "use a non-negative integer",
    "uneven": "use 'pad' (wrap around so every rank gets the same count), 'drop' (trim to the "
              "shortest rank) or 'mask' (full batches with a 'valid' mask: every sample counted "
              "once, for evaluation)",
    "size": "use an int (square) or (height, width) of positive ints",
    "crop": "use 'resize', 'center_crop', 'random_resized_crop' or 'none'",
    "dali_reader": "use 'plan' (feedpipe's order, every format) or 'webdataset' (DALI's native "
                   "tar reader and order, WebDataset only)",
    "decode_on": "use 'cpu' (workers decode), 'device' (nvJPEG on the CUDA device through "
                 "torchvision) or 'auto' (the CPU workers, until a GPU run shows nvJPEG feeds "
                 "the step more: benchmarks/RESULTS.md)",
    "num_workers": "use 'auto' or an int >= 0 (0 loads in the main process); for measured "
                   "trials, workers=feedpipe.tuned()",
    "prefetch_factor": "use 'auto' or an int >= 1",
    "on_error": "use 'raise' or 'skip' (count and refill)",
    "shuffle_window": "use a positive shard count, or None for the shuffle buffer",
    "max_pixels": "use a positive pixel count (width x height) or None for the dataset's own "
                  "limit",
    "max_scans": "use a positive count of JPEG scans or None for the dataset's own limit",
    "max_pixels_per_byte": "use a positive count of pixels a JPEG may declare per byte of file, "
                           "or None for the dataset's own limit",
    "ragged": "use 'pad' (N×max rows plus counts/lengths: fixed-rank tensors, for DDP and "
              "torch.compile) or 'list' (one tensor per sample)",
    "min_box_fraction": "use a fraction in [0, 1] of a box's area that must stay in the crop",
    "weights": "give one positive weight per mixed dataset (feedpipe.Mix([a, b], weights=...)), "
               "or None (each sample once per epoch)",
    "epoch_size": "use a positive sample count per epoch, or None (the datasets' sizes summed)",
    "mix_classes": "use 'equal' (refuse differing class lists) or 'union' (remap labels into "
                   "one list)",
    "mean": "give three per-channel values (RGB, in 0..1 units), or None",
    "std": "give three per-channel values (RGB, in 0..1 units), or None",
    "timeout": "use seconds > 0 (each request to a URL's store waits that long to connect or "
               "for its next bytes), or None for 30",
}


@dataclass(frozen=True)
class LoaderConfig:
    """What to load, how to augment it, where to put it, and how to parallelize.

    Every option is checked against its annotation (``flip="yes"`` and ``batch_size=2.0`` are
    refused, naming the option and what it accepts) and then by value.
    """

    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    uneven: Uneven = "pad"
    fields: tuple[str, ...] | None = None
    size: tuple[int, int] | None = None  # an int is taken as a square
    crop: Crop = "center_crop"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    device: str = "auto"
    dtype: Dtype = "float32"
    mean: tuple[float, float, float] | None = IMAGENET_MEAN
    std: tuple[float, float, float] | None = IMAGENET_STD
    channels_last: bool = True
    backend: Backend = "auto"
    dali_reader: DaliReader = "plan"   # "webdataset": DALI's own tar reader (its order; opt-in)
    dali_hw_decoder_load: float = 0.65  # share of JPEGs for the A100/H100 hardware decoder
    decode_on: DecodeOn = "auto"
    num_workers: int | Auto = "auto"
    prefetch_factor: int | Auto = "auto"
    pin_memory: bool | Auto = "auto"
    multiprocessing_context: MpContext | None = None
    shuffle_buffer: int = 1000
    shuffle_window: int | None = 8  # sharded data: shards per shuffle window (None: the buffer)
    on_error: OnError = "raise"
    max_pixels: int | None = None  # None: the dataset's recorded limit, else DEFAULT_MAX_PIXELS
    batch_timeout: float | None = None  # s a worker may take over a batch; None: no limit
    max_scans: int | None = None  # a JPEG's scans; None: as max_pixels (DEFAULT_MAX_SCANS)
    max_pixels_per_byte: int | None = None  # None: as max_pixels (DEFAULT_MAX_PIXELS_PER_BYTE)
    transform: Callable[..., Any] | None = None  # the user's per-sample function, in the workers
    batch_transforms: Any = None  # batch operations on the device (feedpipe.loader.augment)
    affine: Any = None  # a feedpipe.loader.transforms.RandomAffine, in the crop's resampling
    ragged: Ragged = "pad"  # boxes and variable-shape arrays: padded with counts, or lists
    min_box_fraction: float = 0.0  # boxes keeping less of their area in the crop are dropped
    weights: tuple[float, ...] | None = None  # a mix's shares (feedpipe.loader.mixing)
    epoch_size: int | None = None  # a mix's samples per epoch; None: the sizes summed
    mix_classes: MixClasses = "equal"
    cache_dir: str | None = None  # a URL's node-local cache (None: $FEEDPIPE_CACHE or ~/.cache)
    cache_limit: int | str | None = None  # its size bound: bytes or "200GB"; None: unbounded
    storage_options: dict[str, Any] | None = None  # passed to the URL's fsspec filesystem
    timeout: float | None = None  # a URL's requests: s to connect / between bytes (None: 30)

    def __post_init__(self) -> None:
        def bad(option: str, how: str) -> None:
            raise ConfigError(f"{option}={getattr(self, option)!r}: {how}", option=option)

        self._normalize()
        hints = _hints()
        for f in dataclass_fields(self):
            value = getattr(self, f.name)
            if not conforms(value, hints[f.name]):
                how = _HOW.get(f.name) or f"use {describe(hints[f.name])}"
                bad(f.name, how)
        if self.batch_size < 1:
            bad("batch_size", _HOW["batch_size"])
        if self.seed < 0:
            bad("seed", _HOW["seed"])
        if self.transform is not None and not callable(self.transform):
            bad("transform", "pass a function (sample, rng) -> sample or None")
        if self.batch_transforms is not None and not (
                callable(self.batch_transforms) or isinstance(self.batch_transforms, (list, tuple))):
            bad("batch_transforms", "pass a list of batch operations (feedpipe.loader.augment) "
                "or functions fn(batch, generator) -> batch")
        if self.affine is not None:
            if not isinstance(self.affine, RandomAffine):
                bad("affine", "pass feedpipe.loader.transforms.RandomAffine(degrees, translate, "
                    "scale, shear) or None")
        if self.uneven == "mask" and self.drop_last:
            raise ConfigError("uneven='mask' pads the last batch to full size and marks the padding "
                              "in 'valid'; drop_last=True would drop real samples: use one or the "
                              "other", option="uneven")
        if self.size is not None and min(self.size) < 1:
            bad("size", _HOW["size"])
        lo, hi = self.scale
        if not 0 < lo <= hi <= 1:
            bad("scale", "use 0 < min <= max <= 1 (fractions of the image area)")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            bad("ratio", "use 0 < min <= max (width / height)")
        if (self.mean is None) != (self.std is None):
            raise ConfigError("mean and std go together: pass both, or mean=None, std=None for no "
                              "normalization", option="mean")
        if self.std is not None and any(s <= 0 for s in self.std):
            bad("std", "values must be positive")
        if not 0.0 <= self.dali_hw_decoder_load <= 1.0:
            bad("dali_hw_decoder_load", "use a fraction in [0, 1]")
        if isinstance(self.num_workers, int) and self.num_workers < 0:
            bad("num_workers", _HOW["num_workers"])
        if isinstance(self.prefetch_factor, int) and self.prefetch_factor < 1:
            bad("prefetch_factor", _HOW["prefetch_factor"])
        if self.shuffle_buffer < 1:
            bad("shuffle_buffer", "use a positive sample count")
        if self.shuffle_window is not None and self.shuffle_window < 1:
            bad("shuffle_window", _HOW["shuffle_window"])
        for limit in ("max_pixels", "max_scans", "max_pixels_per_byte"):
            if getattr(self, limit) is not None and getattr(self, limit) < 1:
                bad(limit, _HOW[limit])
        if not 0.0 <= self.min_box_fraction <= 1.0:
            bad("min_box_fraction", _HOW["min_box_fraction"])
        if self.weights is not None and (not self.weights or min(self.weights) < 0
                                         or sum(self.weights) <= 0):
            bad("weights", _HOW["weights"])
        if self.epoch_size is not None and self.epoch_size < 1:
            bad("epoch_size", _HOW["epoch_size"])
        parse_limit(self.cache_limit)  # "200GB", bytes or None; a ConfigError names it
        if self.timeout is not None and not self.timeout > 0:
            bad("timeout", _HOW["timeout"])
        if self.batch_timeout is not None and not self.batch_timeout > 0:
            bad("batch_timeout", "use seconds > 0, or None to wait (named in a warning)")

    def _normalize(self) -> None:
        """The spellings taken for convenience: an int size is a square, lists are tuples, and
        mean/std become floats, and a ``torch.device`` its string."""
        if isinstance(self.cache_dir, os.PathLike):
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        if not isinstance(self.device, str) and hasattr(self.device, "type"):
            object.__setattr__(self, "device", str(self.device))
        if isinstance(self.size, int) and not isinstance(self.size, bool):
            object.__setattr__(self, "size", (self.size, self.size))
        for name in ("fields", "size", "scale", "ratio", "mean", "std", "weights",
                     "batch_transforms"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for name in ("mean", "std", "scale", "ratio", "weights"):
            value = getattr(self, name)
            if isinstance(value, tuple) and all(conforms(v, float) for v in value):
                object.__setattr__(self, name, tuple(float(v) for v in value))

    def fields_in(self, schema: Container[str]) -> tuple[str, ...]:
        """The fields to load: ``fields``, else those of :data:`DEFAULT_FIELDS` in ``schema``,
        else (array and time-series data: no image, no label) every field."""
        if self.fields:
            return self.fields
        names: list[str] = list(getattr(schema, "names", ()))
        return tuple(n for n in DEFAULT_FIELDS if n in schema) or tuple(names)

    def resolve(self, *, cuda: bool, decodes: bool) -> "LoaderConfig":
        """Replace every "auto" with a concrete value (see :func:`auto_workers`)."""
        workers = auto_workers(decodes) if self.num_workers == "auto" else self.num_workers
        return replace(
            self,
            num_workers=workers,
            prefetch_factor=(PREFETCH_DECODE if decodes else 2) if self.prefetch_factor == "auto"
            else self.prefetch_factor,
            pin_memory=cuda if self.pin_memory == "auto" else self.pin_memory,
        )


@cache
def _hints() -> dict[str, Any]:
    return get_type_hints(LoaderConfig)


def auto_workers(decodes: bool, cores: int | None = None, local_procs: int | None = None) -> int:
    """The ``num_workers="auto"`` heuristic.

    Usable cores are shared among the local data-parallel processes (``LOCAL_WORLD_SIZE``, one
    per local GPU under torchrun). Decoding is CPU-bound, so each process gets one worker per
    core of its share (the main process mostly waits on the queue and copies to the device).
    Raw, decode-free data is memory-bound: at most :data:`RAW_WORKERS` workers. Since batches
    travel in a reused shared-memory ring, 2 workers load it faster than the main process
    (side-by-side runs of ``benchmarks/bench_kernel.py --groups raw``: benchmarks/RESULTS.md) for
    about the same CPU per sample, and leave the main process free for the training step.
    """
    cores = cores or usable_cores()
    local = local_procs or int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    share = max(1, cores // max(1, local))
    return share if decodes else min(share, RAW_WORKERS)
