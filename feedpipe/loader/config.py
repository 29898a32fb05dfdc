"""The loader's configuration: :class:`LoaderConfig`, ``make_loader``'s options with its groups
nested (``cfg.workers.prefetch_factor``), and the sources that take options (:class:`Remote`,
:class:`Mix`). Each checks its fields when built; "auto" stays until ``loader.api.resolve``."""

from __future__ import annotations

import difflib
import functools
import inspect
import os
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar, get_args, get_type_hints

from ..checks import conforms, describe
from ..errors import ConfigError
from ..storage.cache import parse_limit
from ..system import usable_cores as usable_cores  # re-exported: tests and benchmarks name it
from .affine_params import RandomAffine

if TYPE_CHECKING:
    import torch

    from ..dataset.registry import DatasetReader

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
T = TypeVar("T")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_FIELDS = ("image", "label")  # what a loader yields when ``fields`` is not given
RAW_WORKERS = 2  # "auto" workers for decode-free data: memory-bound, more were not measured
PREFETCH_DECODE = 4  # batches each worker keeps ahead when it decodes ("auto"; 2 when it does not)

# How to fix a bad value, for options whose accepted values need more than their type to explain.
_HOW = {
    "batch_size": "use a positive integer",
    "seed": "use a non-negative integer",
    "size": "use an int (square) or (height, width) of positive ints",
    "decode_on": "use 'cpu' (the workers decode), 'device' (nvJPEG on the CUDA device) or 'auto'",
    "num_workers": "use 'auto' or an int >= 0 (0: the main process), or workers=feedpipe.tuned()",
    "prefetch_factor": "use 'auto' or an int >= 1",
    "shuffle_window": "use a positive shard count, or None for the shuffle buffer",
    "shuffle_buffer": "use a positive sample count",
    "batch_timeout": "use seconds > 0, or None to wait (named in a warning)",
    "hw_decoder_load": "use a float, the fraction in [0, 1] of JPEGs for the hardware decoder",
    "scale": "use a (float, float) tuple, 0 < min <= max <= 1 (fractions of the image area)",
    "ratio": "use a (float, float) tuple, 0 < min <= max (width / height)",
    "max_pixels": "use a positive pixel count (width x height), or None for the dataset's limit",
    "max_scans": "use a positive count of JPEG scans, or None for the dataset's limit",
    "max_pixels_per_byte": "use a positive count of pixels per byte, or None for the dataset's",
    "min_box_fraction": "use a fraction in [0, 1] of a box's area that must stay in the crop",
    "weights": "give one positive weight per mixed dataset, or None (each sample once an epoch)",
    "epoch_size": "use a positive sample count per epoch, or None (the datasets' sizes summed)",
    "mean": "give three per-channel values (RGB, in 0..1 units), or None",
    "std": "give three positive per-channel values (RGB, in 0..1 units), or None",
    "timeout": "use seconds > 0 to connect or to wait for the next bytes, or None for 30",
    "device": "use a str ('auto', 'cpu', 'cuda[:N]') or a torch.device",
    "transform": "pass a function (sample, rng) -> sample or None",
    "batch_transforms": "pass a list of batch operations (feedpipe.loader.augment) or functions "
                        "fn(batch, generator) -> batch",
    "affine": "pass feedpipe.loader.transforms.RandomAffine(...) or None",
    "workers": "pass feedpipe.Workers(...) or feedpipe.tuned(...)",
    "output": "pass feedpipe.Output(...) or None",
    "sampler": "pass feedpipe.Sampler(...) or None",
}

#: the checks by value beyond the annotations, by option name (wherever the option is)
_VALID: dict[str, Callable[[Any], bool]] = {
    **dict.fromkeys(("batch_size", "prefetch_factor", "max_pixels", "max_scans", "epoch_size",
                     "max_pixels_per_byte", "shuffle_window", "shuffle_buffer"), lambda v: v >= 1),
    **dict.fromkeys(("seed", "num_workers"), lambda v: v >= 0),
    **dict.fromkeys(("batch_timeout", "timeout"), lambda v: v > 0),  # (NaN is not)
    **dict.fromkeys(("min_box_fraction", "hw_decoder_load"), lambda v: 0 <= v <= 1),
    "size": lambda v: min(v) >= 1, "scale": lambda v: 0 < v[0] <= v[1] <= 1,
    "ratio": lambda v: 0 < v[0] <= v[1], "transform": callable,
    "device": lambda v: isinstance(v, str) or hasattr(v, "type"),
    "batch_transforms": lambda v: callable(v) or isinstance(v, tuple),
    "std": lambda v: min(v) > 0, "weights": lambda w: isinstance(w, tuple) and len(w) > 0 and all(
        conforms(v, float) for v in w) and min(w) >= 0 and sum(w) > 0}

#: torch, imported for type checkers only: any value passes its annotation check here
_LATE = {"torch": SimpleNamespace(device=object)}
_HINTS: dict[type, dict[str, Any]] = {}  # each class's annotations, evaluated once


def checked(target: T) -> T:
    """A mistyped keyword of the function or class ``target`` (``make_loader(flp=True)``) gets a
    did-you-mean ConfigError; ``inspect.signature`` and ``help()`` still see its signature."""
    t: Any = target
    is_class = isinstance(t, type)
    fn = t.__init__ if is_class else t
    params = inspect.signature(fn).parameters.values()
    known = [p.name for p in params if p.name != "self"]
    listed = ", ".join(p.name for p in params if p.default is not p.empty)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        for name in kwargs:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                raise ConfigError(f"{t.__name__}() got an unexpected keyword argument {name!r}; "
                                  + (f"did you mean {close[0]!r}?" if close else
                                     f"the options are {listed}"), option=name)
        return fn(*args, **kwargs)

    if is_class:
        t.__init__ = call
        return target
    return call  # type: ignore[return-value]


@dataclass(frozen=True)
class World:
    """This process's rank among ``size`` data-parallel processes."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ConfigError(f"invalid world: rank {self.rank} of {self.size}")

    @classmethod
    def detect(cls) -> "World":
        """torch.distributed when initialized, else RANK/WORLD_SIZE, else a single process."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return cls(dist.get_rank(), dist.get_world_size())
        except ImportError:  # torch without distributed support
            pass
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))


class Options:
    """An option group's checks when built: each field in its kept spelling (lists as tuples,
    :meth:`_spellings`) against its annotation, then :meth:`_check`, by value."""

    def __post_init__(self) -> None:
        hints = _HINTS.get(type(self)) or _HINTS.setdefault(
            type(self), get_type_hints(type(self), localns=_LATE))
        for name, value in self._spellings().items():
            object.__setattr__(self, name, value)
        for f in fields(self):  # type: ignore[arg-type]
            value, hint = getattr(self, f.name), hints[f.name]
            if isinstance(value, list):
                value = tuple(value)
            if isinstance(value, tuple) and all(conforms(v, float) for v in value) and any(
                    float in get_args(h) for h in (hint, *get_args(hint))):
                value = tuple(float(v) for v in value)
            object.__setattr__(self, f.name, value)
            if not conforms(value, hint):
                self._refuse(f.name, _HOW.get(f.name) or f"use {describe(hint)}")
            if f.name in _VALID and value not in (None, "auto") and not _VALID[f.name](value):
                self._refuse(f.name)
        self._check()

    def _spellings(self) -> dict[str, Any]:
        """Fields given in a convenient spelling, in the spelling kept."""
        return {}

    def _check(self) -> None:
        """The checks by value, beyond the annotations."""

    def _refuse(self, option: str, how: str | None = None) -> NoReturn:
        raise ConfigError(f"{option}={getattr(self, option)!r}: {how or _HOW[option]}",
                          option=option)


@checked
@dataclass(frozen=True)
class Workers(Options):
    """``workers=Workers(...)``: the loading processes, with DataLoader's names. They live as long
    as the loader (``loader.close()`` ends them), so an epoch's end never waits for them.

    Args:
        prefetch_factor: Batches each worker keeps ahead; "auto": 4 when they decode, else 2.
        pin_memory: Batches in page-locked memory for a fast copy to the GPU; "auto": on for
            CUDA.
        multiprocessing_context: "fork", "spawn" or "forkserver"; None: torch's default.
        decode_on: "cpu" (the workers decode), "device" (nvJPEG on the CUDA device) or "auto"
            (the workers, until a GPU run shows nvJPEG feeds the step more).
        on_error: "raise", or "skip" a corrupt sample: counted, named (``loader.skipped``) and
            replaced.
        max_pixels: The decompression-bomb limit; None: the dataset's own.
        batch_timeout: Seconds a worker may take over one batch before a LoaderError names it;
            None: wait (naming the batch in a warning each minute).
        max_scans: A JPEG's scans at most (scan bombs); None: the dataset's own.
        max_pixels_per_byte: Pixels a JPEG may declare per byte of its file (one cut short);
            None: the dataset's own. Checked from the header, before decoding.
    """

    prefetch_factor: int | Auto = "auto"
    pin_memory: bool | Auto = "auto"
    multiprocessing_context: MpContext | None = None
    decode_on: DecodeOn = "auto"
    on_error: OnError = "raise"
    max_pixels: int | None = None
    batch_timeout: float | None = None
    max_scans: int | None = None
    max_pixels_per_byte: int | None = None


@checked
@dataclass(frozen=True)
class Tuned(Options):
    """``workers=feedpipe.tuned(...)``: ``num_workers`` and ``prefetch_factor`` measured
    (``measure``: :func:`feedpipe.autotune`, with ``options``) before loading; ``workers``
    holds the other worker settings."""

    measure: Callable[..., Any]
    options: Mapping[str, Any] = field(default_factory=dict)
    workers: Workers = Workers()


@checked
@dataclass(frozen=True)
class Output(Options):
    """``output=Output(...)``: how batches come out.

    Args:
        dtype: The images' dtype: "float32", "float16", "bfloat16" (normalized), or "uint8"
            (as stored).
        mean: Per-channel RGB mean in 0..1 units, subtracted (ImageNet's by default); None
            with ``std=None``: no normalization.
        std: Per-channel RGB standard deviation in 0..1 units, divided by.
        channels_last: Images in the channels-last memory format (N×C×H×W shape).
        ragged: Boxes and variable-shape arrays: "pad" (N×max rows plus counts) or "list" (a
            tensor per sample).
        min_box_fraction: Boxes keeping less of their area inside the crop are dropped (0..1).
    """

    dtype: Dtype = "float32"
    mean: tuple[float, float, float] | None = IMAGENET_MEAN
    std: tuple[float, float, float] | None = IMAGENET_STD
    channels_last: bool = True
    ragged: Ragged = "pad"
    min_box_fraction: float = 0.0

    def _check(self) -> None:
        if (self.mean is None) != (self.std is None):
            raise ConfigError("mean and std go together: pass both, or mean=None, std=None for "
                              "no normalization", option="mean")


@checked
@dataclass(frozen=True)
class Sampler(Options):
    """``sampler=Sampler(...)``: which samples, in what order (DistributedSampler's place).

    Args:
        world: This process's ``World(rank, size)``; None: from torch.distributed or torchrun's
            environment.
        uneven: When the samples do not divide among the ranks: "pad" wraps round, "drop"
            trims, "mask" pads and marks the padding False in ``batch["valid"]`` (exact
            evaluation: every sample counted once).
        shuffle_window: Sharded data: shards shuffled together (docs/shuffle.md); None: the
            buffer.
        shuffle_buffer: Samples shuffled together when ``shuffle_window`` is None.
    """

    world: World | None = None
    uneven: Uneven = "pad"
    shuffle_window: int | None = 8
    shuffle_buffer: int = 1000


@checked
@dataclass(frozen=True)
class RandomResizedCrop(Options):
    """``crop=RandomResizedCrop(scale, ratio)``: torchvision's crop with its ranges.

    Args:
        scale: The range of the crop's area, as fractions of the image's.
        ratio: The range of the crop's aspect ratio (width / height).
    """

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)


@checked
@dataclass(frozen=True)
class Dali(Options):
    """``backend=Dali(...)``: NVIDIA DALI (docs/dali.md).

    Args:
        reader: "plan" (feedpipe's order, every format) or "webdataset" (DALI's own tar
            reader, its order).
        hw_decoder_load: The share of JPEGs for the A100/H100 hardware decoder (0..1).
    """

    reader: DaliReader = "plan"
    hw_decoder_load: float = 0.65


@checked
@dataclass(frozen=True)
class Remote(Options):
    """``source=Remote(url, ...)``: a dataset in object storage, through a local cache
    (docs/remote.md).

    Args:
        url: s3://, gs://, https:// or hf:// (a local path works too).
        cache_dir: The node-local cache; None: ``$FEEDPIPE_CACHE`` or
            ~/.cache/feedpipe/remote.
        cache_limit: The cache's size limit, in bytes or as "200GB".
        storage_options: Options for the URL's fsspec filesystem (endpoint, credentials).
        timeout: Seconds to connect or to wait for the next bytes; None: 30.
    """

    url: str | os.PathLike[str]
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None
    storage_options: Mapping[str, Any] | None = None
    timeout: float | None = None

    def _check(self) -> None:
        if not isinstance(self.cache_dir, (str, os.PathLike, type(None))):
            self._refuse("cache_dir", "use a directory path, or None")
        if not isinstance(self.storage_options, (Mapping, type(None))):
            self._refuse("storage_options", "use a dict of the filesystem's options, or None")
        parse_limit(self.cache_limit)  # "200GB", bytes or None; a ConfigError names it

    def open(self) -> DatasetReader:
        """The dataset, through the cache."""
        from ..dataset.registry import open_dataset

        return open_dataset(self.url, cache_dir=self.cache_dir, cache_limit=self.cache_limit,
                            storage_options=self.storage_options, timeout=self.timeout)


@checked
@dataclass(frozen=True)
class Mix(Options):
    """``source=Mix([...])``: several datasets read as one, with a ``source`` field
    (docs/mixing.md).

    Args:
        sources: A list or ``{name: dataset}`` of paths, URLs, ``Remote``s or opened datasets.
        weights: Their shares of each epoch; None: each sample once.
        epoch_size: Samples per epoch; None: the sizes summed.
        classes: "equal" (refuse differing class lists) or "union" (remap the labels into one
            list).
    """

    sources: Sequence[Any] | Mapping[str, Any]
    weights: Sequence[float] | None = None
    epoch_size: int | None = None
    classes: MixClasses = "equal"

    def opened(self) -> Sequence[Any] | Mapping[str, Any]:
        """The sources, each :class:`Remote` opened (plain paths are opened by the mix)."""
        def one(s: Any) -> Any:
            return s.open() if isinstance(s, Remote) else s

        if isinstance(self.sources, Mapping):
            return {k: one(v) for k, v in self.sources.items()}
        if isinstance(self.sources, (str, os.PathLike)) or not isinstance(self.sources, Sequence):
            raise ConfigError(f"Mix(sources={self.sources!r}): give a list of datasets or a dict "
                              "{name: dataset}", option="source")
        return [one(s) for s in self.sources]


@checked
@dataclass(frozen=True)
class LoaderConfig(Options):
    """``make_loader``'s options (see there) with its groups nested, in its spellings (an int
    ``size``, a group None, ``crop=RandomResizedCrop(...)``, ``backend=Dali(...)``); ``mix``: a
    ``Mix`` source's. ``loader.config`` is this with every "auto" resolved."""

    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    fields: tuple[str, ...] | None = None
    size: tuple[int, int] | None = None
    crop: Crop = "center_crop"
    flip: bool = False
    affine: RandomAffine | None = None  # in the crop's resampling
    transform: Callable[..., Any] | None = None  # the user's per-sample function, in the workers
    batch_transforms: Any = None  # batch operations on the device (feedpipe.loader.augment)
    device: str | torch.device = "auto"
    num_workers: int | Auto = "auto"
    workers: Workers = Workers()
    output: Output = Output()
    sampler: Sampler = Sampler()
    backend: Backend = "auto"
    random_resized_crop: RandomResizedCrop = RandomResizedCrop()
    dali: Dali = Dali()
    mix: Mix | None = None

    def _spellings(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: f.default for f in fields(self)
                               if getattr(self, f.name) is None and isinstance(f.default, Options)}
        if isinstance(self.size, int) and not isinstance(self.size, bool):
            out["size"] = (self.size, self.size)
        if isinstance(self.crop, RandomResizedCrop):
            out.update(crop="random_resized_crop", random_resized_crop=self.crop)
        if isinstance(self.backend, Dali):
            out.update(backend="dali", dali=self.backend)
        return out

    def _check(self) -> None:
        if self.sampler.uneven == "mask" and self.drop_last:
            raise ConfigError("uneven='mask' pads the last batch to full size and marks the "
                              "padding in 'valid'; drop_last=True would drop real samples: use "
                              "one or the other", option="uneven")

    def fields_in(self, schema: Container[str]) -> tuple[str, ...]:
        """The fields to load: ``fields``, else those of :data:`DEFAULT_FIELDS` in ``schema``,
        else (array and time-series data: no image, no label) every field."""
        return self.fields or tuple(n for n in DEFAULT_FIELDS if n in schema) or tuple(
            getattr(schema, "names", ()))


def auto_workers(decodes: bool, cores: int | None = None, local_procs: int | None = None) -> int:
    """``num_workers="auto"``: a worker per core of this process's share (``LOCAL_WORLD_SIZE``)
    of the usable cores when decoding (CPU-bound), else at most :data:`RAW_WORKERS`."""
    cores = cores or usable_cores()
    local = local_procs or int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    share = max(1, cores // max(1, local))
    return share if decodes else min(share, RAW_WORKERS)


__all__ = ["Dali", "LoaderConfig", "Mix", "Output", "RandomResizedCrop", "Remote", "Sampler",
           "Tuned", "Workers", "auto_workers", "checked"]
