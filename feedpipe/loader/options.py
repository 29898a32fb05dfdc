"""``make_loader``'s option groups: small frozen objects for what most calls leave alone.

``make_loader`` keeps the everyday options flat (``batch_size``, ``size``, ``crop``, ``flip``,
``num_workers``, ...); the rest sit in these groups, each checked when built: an unknown field
gets the closest one named (a :class:`~feedpipe.errors.ConfigError`), values are checked with
the flat :class:`~feedpipe.loader.config.LoaderConfig` they fold into (:func:`flatten`).
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

from ..errors import ConfigError
from .config import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Auto,
    DaliReader,
    DecodeOn,
    Dtype,
    LoaderConfig,
    MixClasses,
    MpContext,
    OnError,
    Ragged,
    Uneven,
)

if TYPE_CHECKING:
    from ..dataset.registry import DatasetReader
    from .sampler import World

T = TypeVar("T")


def unknown(name: str, known: Sequence[str], where: str,
            listed: Sequence[str] | None = None) -> ConfigError:
    """``where`` got ``name``, which it does not take: name the closest of ``known``, else list
    ``listed`` (default: all of them)."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else \
        f"the options are {', '.join(known if listed is None else listed)}"
    return ConfigError(f"{where} got an unexpected keyword argument {name!r}; {hint}", option=name)


def checked(cls: type[T]) -> type[T]:
    """A typo in a field (``Workers(prefech_factor=2)``) gets a did-you-mean ConfigError."""
    init = cls.__init__
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in known:
                raise unknown(name, known, f"{cls.__name__}()")
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


@checked
@dataclass(frozen=True)
class Workers:
    """The loading processes (``num_workers`` of them, a ``make_loader`` option): DataLoader's
    names; plus ``decode_on`` ("cpu": they decode; "device": nvJPEG on the CUDA device;
    "auto"), ``on_error`` ("raise", or "skip" a corrupt sample: counted, named, refilled) and
    the bounds on one encoded image, checked from its header before it is decoded:
    ``max_pixels`` (decompression bombs), ``max_scans`` and ``max_pixels_per_byte`` (JPEG scan
    bombs and files cut short; ``imaging.check_jpeg``); None: the dataset's own."""

    prefetch_factor: int | Auto = "auto"  # batches each keeps ahead; "auto": 4 decoding, else 2
    pin_memory: bool | Auto = "auto"  # "auto": on for CUDA
    persistent_workers: bool | Auto = "auto"  # "auto": when there are workers
    multiprocessing_context: MpContext | None = None  # None: torch's default
    decode_on: DecodeOn = "auto"
    on_error: OnError = "raise"
    max_pixels: int | None = None
    max_scans: int | None = None
    max_pixels_per_byte: int | None = None


@checked
@dataclass(frozen=True)
class Tuned:
    """``workers=feedpipe.tuned(...)``: ``num_workers`` and ``prefetch_factor`` measured
    (``measure``: :func:`feedpipe.autotune`, with ``options``) before loading; ``workers``
    holds the other worker settings."""

    measure: Callable[..., Any]
    options: Mapping[str, Any] = field(default_factory=dict)
    workers: Workers = Workers()


@checked
@dataclass(frozen=True)
class Output:
    """How batches come out: ``dtype`` ("float32", "float16", "bfloat16" normalized, or
    "uint8" as stored), per-channel RGB ``mean``/``std`` in 0..1 units (both None: no
    normalization), ``channels_last`` memory format, ``ragged`` boxes and variable-shape arrays
    ("pad": N×max rows plus counts; "list": a tensor per sample), and ``min_box_fraction``
    (boxes keeping less of their area inside the crop are dropped)."""

    dtype: Dtype = "float32"
    mean: tuple[float, float, float] | None = IMAGENET_MEAN
    std: tuple[float, float, float] | None = IMAGENET_STD
    channels_last: bool = True
    ragged: Ragged = "pad"
    min_box_fraction: float = 0.0


@checked
@dataclass(frozen=True)
class Sampler:
    """Which samples, in what order (DistributedSampler's place): ``world`` (rank and size;
    None: from torchrun), ``uneven`` shares across ranks ("pad" wraps, "drop" trims, "mask"
    marks the padding in ``valid``), ``shuffle_window`` (sharded data: shards shuffled together;
    None: the buffer) and ``shuffle_buffer`` (samples; docs/shuffle.md)."""

    world: World | None = None
    uneven: Uneven = "pad"
    shuffle_window: int | None = 8
    shuffle_buffer: int = 1000


@checked
@dataclass(frozen=True)
class RandomResizedCrop:
    """``crop=RandomResizedCrop(scale, ratio)``: torchvision's crop with its ranges of the
    image area (fractions) and of aspect ratios (width / height)."""

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)


@checked
@dataclass(frozen=True)
class Dali:
    """``backend=Dali(...)``: NVIDIA DALI, with ``reader`` "plan" (feedpipe's order, every
    format) or "webdataset" (DALI's own tar reader), and ``hw_decoder_load``, the share of JPEGs
    for the A100/H100 hardware decoder (0..1)."""

    reader: DaliReader = "plan"
    hw_decoder_load: float = 0.65


@checked
@dataclass(frozen=True)
class Remote:
    """A dataset URL (s3://, gs://, https://, hf://) with its node-local ``cache_dir`` (None:
    ``$FEEDPIPE_CACHE`` or ~/.cache/feedpipe/remote), ``cache_limit`` (bytes or "200GB"),
    ``storage_options`` for its fsspec filesystem, and ``timeout`` (seconds to connect or for
    the next bytes; None: 30); docs/remote.md."""

    url: str | os.PathLike[str]
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None
    storage_options: Mapping[str, Any] | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        """The same checks as the flat options had: a ConfigError names the field."""
        LoaderConfig(1, cache_dir=self.cache_dir, cache_limit=self.cache_limit,  # type: ignore[arg-type]
                     storage_options=self.storage_options, timeout=self.timeout)  # type: ignore[arg-type]

    def open(self) -> DatasetReader:
        """The dataset, through the cache."""
        from ..dataset.registry import open_dataset

        return open_dataset(self.url, cache_dir=self.cache_dir, cache_limit=self.cache_limit,
                            storage_options=self.storage_options, timeout=self.timeout)


@checked
@dataclass(frozen=True)
class Mix:
    """Several datasets read as one, with a ``source`` field (docs/mixing.md): ``sources`` a
    list or ``{name: dataset}`` (paths, URLs, :class:`Remote`, opened readers); ``weights``
    their shares of each epoch (None: each sample once); ``epoch_size`` samples per epoch
    (None: the sizes summed); ``classes`` "equal" (refuse differing class lists) or "union"
    (remap the labels into one list)."""

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


#: Each group's fields -> the flat LoaderConfig option each sets (the same name unless given).
_FLAT: dict[type, dict[str, str]] = {
    Workers: {f.name: f.name for f in fields(Workers)},
    Output: {f.name: f.name for f in fields(Output)},
    Sampler: {"uneven": "uneven", "shuffle_window": "shuffle_window",
              "shuffle_buffer": "shuffle_buffer"},
    RandomResizedCrop: {"scale": "scale", "ratio": "ratio"},
    Dali: {"reader": "dali_reader", "hw_decoder_load": "dali_hw_decoder_load"},
    Mix: {"weights": "weights", "epoch_size": "epoch_size", "classes": "mix_classes"},
}


def flatten(group: object) -> dict[str, Any]:
    """The LoaderConfig options ``group`` sets, where they differ from its defaults."""
    out: dict[str, Any] = {}
    for f in fields(group):  # type: ignore[arg-type]
        name = _FLAT[type(group)].get(f.name)
        value = getattr(group, f.name)
        if name is not None and not (value is f.default or (
                type(value) is type(f.default) and value == f.default)):
            out[name] = value
    return out


def expect(value: object, kind: type | tuple[type, ...], option: str, how: str) -> None:
    """A group passed where it belongs, else a ConfigError naming ``option``."""
    if value is not None and not isinstance(value, kind):
        raise ConfigError(f"{option}={value!r}: {how}", option=option)


__all__ = ["Dali", "Mix", "Output", "RandomResizedCrop", "Remote", "Sampler", "Tuned", "Workers",
           "expect", "flatten", "unknown"]
