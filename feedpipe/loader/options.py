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
    """``workers=Workers(...)``: the loading processes (``num_workers`` of them, a
    ``make_loader`` option), with DataLoader's names where DataLoader has the setting. They live
    as long as the loader (``loader.close()`` or ``del loader`` ends them), so an epoch's end
    never waits for them to drain or start again.

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
        batch_timeout: Seconds a worker may take over one batch before the loader raises a
            LoaderError naming it and stops the workers (a ``transform=`` that never
            returns); None: wait (after 60 s the batch is named in a warning, each minute).
        max_scans: A JPEG's scans at most (scan bombs); None: the dataset's own.
        max_pixels_per_byte: Pixels a JPEG may declare per byte of its file (a file cut short,
            or claiming a size it cannot hold); None: the dataset's own. These bounds are checked
            from the header, before anything is decoded (``imaging.check_jpeg``).
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


@checked
@dataclass(frozen=True)
class Sampler:
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
class RandomResizedCrop:
    """``crop=RandomResizedCrop(scale, ratio)``: torchvision's crop with its ranges.

    Args:
        scale: The range of the crop's area, as fractions of the image's.
        ratio: The range of the crop's aspect ratio (width / height).
    """

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)


@checked
@dataclass(frozen=True)
class Dali:
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
class Remote:
    """``source=Remote(url, ...)``: a dataset in object storage, read through a node-local
    cache (docs/remote.md).

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
