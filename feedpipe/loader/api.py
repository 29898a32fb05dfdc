"""``make_loader``: the call that replaces ``DataLoader(...)`` in training code."""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import os
from dataclasses import fields as dataclass_fields
from dataclasses import replace
from typing import Any, Callable, Mapping, ParamSpec, Protocol, Sequence, TypeVar

import torch

from ..dataset.mixed import MixedReader
from ..dataset.registry import DatasetReader, open_dataset
from ..errors import ConfigError
from ..schema.fields import ImageField
from ..schema.imaging import decoder_info
from .config import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Auto,
    Backend,
    Crop,
    DaliReader,
    DecodeOn,
    Dtype,
    LoaderConfig,
    MixClasses,
    MpContext,
    OnError,
    Ragged,
    Tune,
    Uneven,
    auto_workers,
    usable_cores,
)
from .dali.backend import DaliLoader, choose_backend, dali_loader
from .mixing import Sources, open_mix
from .passthrough import warn_meta
from .protocol import Loader, LoaderView
from .sampler import World
from .torch.backend import TorchLoader
from .torch.device_decode import choose as choose_decoder

log = logging.getLogger("feedpipe.loader")
P = ParamSpec("P")
R = TypeVar("R")
_DEFAULTS = {f.name: f.default for f in dataclass_fields(LoaderConfig) if f.name != "batch_size"}


class TunedOptions(Protocol):
    """A measurement's result: the ``make_loader`` options it stands for."""

    def loader_options(self) -> dict[str, Any]: ...


# What num_workers="tune" runs: (reader, batch_size, world=..., **options) -> TunedOptions
Tuner = Callable[..., TunedOptions]


_tuner: Tuner | None = None


def set_tuner(tuner: Tuner) -> None:
    """Install the ``num_workers="tune"`` measurement. ``feedpipe.tools.tune`` installs its
    ``autotune`` when imported: the loader layer never imports the tools above it."""
    global _tuner
    _tuner = tuner


def _device(spec: str | torch.device) -> torch.device:
    if str(spec) == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    dev = torch.device(spec)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={spec!r} but CUDA is not available; use device='auto' or 'cpu'",
                          option="device")
    return dev


def _same(value: object, default: object) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def _keywords_checked(fn: Callable[P, R]) -> Callable[P, R]:
    """Refuse an unknown keyword with the closest option named (``flp=`` → did you mean
    ``flip``?); ``inspect.signature``, ``help()`` and editors still see ``fn``'s own signature."""
    known = tuple(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        for name in kwargs:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else \
                    f"; the options are {', '.join(known[2:])}"
                raise TypeError(f"{fn.__name__}() got an unexpected keyword argument "
                                f"{name!r}{hint}")
        return fn(*args, **kwargs)

    return checked


@_keywords_checked
def make_loader(source: str | os.PathLike[str] | DatasetReader | Sources, batch_size: int, *,
                shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                uneven: Uneven = "pad", fields: Sequence[str] | None = None,
                size: int | tuple[int, int] | None = None, crop: Crop = "center_crop",
                scale: tuple[float, float] = (0.08, 1.0),
                ratio: tuple[float, float] = (3 / 4, 4 / 3), flip: bool = False,
                device: str | torch.device = "auto", dtype: Dtype = "float32",
                mean: tuple[float, float, float] | None = IMAGENET_MEAN,
                std: tuple[float, float, float] | None = IMAGENET_STD,
                channels_last: bool = True, backend: Backend = "auto",
                dali_reader: DaliReader = "plan", dali_hw_decoder_load: float = 0.65,
                decode_on: DecodeOn = "auto", num_workers: int | Auto | Tune = "auto",
                prefetch_factor: int | Auto = "auto", pin_memory: bool | Auto = "auto",
                persistent_workers: bool | Auto = "auto",
                multiprocessing_context: MpContext | None = None, shuffle_buffer: int = 1000,
                shuffle_window: int | None = 8,
                on_error: OnError = "raise", max_pixels: int | None = None,
                transform: Callable[..., Any] | None = None,
                batch_transforms: Sequence[Callable[..., Any]] | None = None,
                affine: Any = None,
                ragged: Ragged = "pad", min_box_fraction: float = 0.0,
                cache_dir: str | os.PathLike[str] | None = None,
                cache_limit: int | str | None = None,
                storage_options: dict[str, Any] | None = None, timeout: float | None = None,
                world: World | None = None, weights: Sequence[float] | None = None,
                epoch_size: int | None = None, mix_classes: MixClasses = "equal") -> Loader:
    """Open ``source`` (a packed dataset path or URL, or an opened dataset) and return a batch
    loader.

    ``source`` may also be a list of them, or a dict ``{name: dataset}``: a mix, read as one
    dataset with a ``source`` field (the dataset's position; names in ``loader.source_names``);
    see docs/mixing.md.

    Yields dicts of tensors on the target device — ``image`` as N×C×H×W (normalized ``dtype``,
    channels_last by default), ``label`` as N int64 — plus any other requested ``fields``. Either
    backend returns a :class:`Loader`: ``len()``, ``set_epoch``, ``state_dict``/
    ``load_state_dict``, ``classes`` (the manifest's class names) and ``describe()``. Every new
    ``iter()`` starts its epoch at the first batch; only ``load_state_dict`` resumes mid-epoch.
    Each option is checked by type and value (a :class:`~feedpipe.errors.ConfigError` names
    it); "auto" values are resolved for the machine and the dataset.

    Options (all keyword-only; :class:`~feedpipe.loader.config.LoaderConfig` holds them):

    - ``shuffle``: a new order each epoch, from ``seed`` (mixed with the epoch and the rank).
    - ``seed``: the order's seed (a non-negative int).
    - ``drop_last``: drop the last, short batch of each epoch.
    - ``uneven``: ranks with unequal shares: "pad" (wrap to the same count) or "drop" (trim).
    - ``fields``: the fields to yield (default: ``image`` and ``label`` where the dataset has them).
    - ``size``: output (height, width); an int is a square; None keeps the stored size.
    - ``crop``: "resize", "center_crop", "random_resized_crop" or "none" (needs equal sizes).
    - ``scale``: random_resized_crop's range of the image area (fractions, as torchvision).
    - ``ratio``: random_resized_crop's range of aspect ratios (width / height).
    - ``flip``: flip each sample horizontally with probability 1/2.
    - ``device``: "auto" (CUDA when available), "cpu", "cuda[:N]" or a ``torch.device``.
    - ``dtype``: "float32", "float16", "bfloat16" (normalized) or "uint8" (0..255, as stored).
    - ``mean``: per-channel RGB mean in 0..1 units, or None (with ``std=None``) for none.
    - ``std``: per-channel RGB standard deviation in 0..1 units, or None.
    - ``channels_last``: images in channels_last memory format (faster convolutions).
    - ``backend``: "torch", "dali" (NVIDIA DALI on the GPU) or "auto".
    - ``dali_reader``: "plan" (feedpipe's order, every format) or "webdataset" (DALI's own).
    - ``dali_hw_decoder_load``: share of JPEGs for the A100/H100 hardware decoder (0..1).
    - ``decode_on``: "cpu" (workers), "device" (nvJPEG through torchvision) or "auto".
    - ``num_workers``: loader processes: an int (0: the main process), "auto" or "tune".
    - ``prefetch_factor``: batches each worker keeps ahead; "auto": 4 when decoding, else 2.
    - ``pin_memory``: page-locked host batches for faster copies; "auto": on for CUDA.
    - ``persistent_workers``: keep workers between epochs; "auto": when there are workers.
    - ``multiprocessing_context``: "fork", "spawn", "forkserver" or None (torch's default).
    - ``shuffle_buffer``: WebDataset's shuffle buffer, in samples (with ``shuffle_window=None``,
      and DALI's ``dali_reader="webdataset"``).
    - ``shuffle_window``: sharded data: each rank's samples shuffled within windows of this many
      of its shards, so each shard is read once, inside one window (docs/shuffle.md); None:
      the shuffle buffer instead.
    - ``on_error``: a corrupt sample "raise"s, or is "skip"ped (counted, named, refilled).
    - ``max_pixels``: decompression-bomb limit (width × height); None: the dataset's own.
    - ``transform``: your per-sample function ``fn(sample, rng)``, run in the workers after the
      decode, crop and resize: ``sample`` holds ``image`` as a C×H×W uint8 tensor (a view of the
      batch being filled) and the other stacked fields; edit in place, or return a dict of new
      values of the same shape and dtype. ``rng`` (numpy) is seeded from (seed, epoch, sample):
      batches are the same for any ``num_workers`` and resume exactly (docs/transforms.md).
    - ``affine``: ``RandomAffine(degrees, translate, scale, shear)`` (feedpipe.loader.transforms):
      rotation, scale, translation and shear composed with the crop into one resampling;
      keypoints, boxes, masks and targets follow.
    - ``batch_transforms``: operations on each whole batch on the device, before normalization
      (images uint8, or float in [0, 1]): :mod:`feedpipe.loader.augment`'s ColorJitter,
      RandomGrayscale, RandomErasing, MixUp, CutMix, or your ``fn(batch, generator)``; per-sample
      parameters drawn from a generator seeded by (seed, epoch, rank, batch).
    - ``ragged``: boxes and variable-shape arrays as "pad" (N×max rows + counts/lengths) or
      "list" (a tensor per sample); keypoints, text and boxes: see docs/fields.md.
    - ``min_box_fraction``: drop boxes keeping less of their area inside the crop (0..1).
    - ``cache_dir``: for a URL source (s3://, gs://, https://, hf://), the node-local cache all
      ranks and workers share (default ``$FEEDPIPE_CACHE`` or ``~/.cache/feedpipe/remote``).
    - ``cache_limit``: that cache's bound, bytes or "200GB"; None: unbounded.
    - ``storage_options``: passed to the URL's fsspec filesystem (endpoint, credentials).
    - ``timeout``: a URL's requests wait this many seconds to connect or for their next bytes
      (None: 30), and give up after four times that, retries included (docs/remote.md).
    - ``world``: this process's rank and world size (default: from the torchrun environment).
    - ``weights``: a mix's shares of each epoch, one per dataset (None: each sample once).
    - ``epoch_size``: a mix's samples per epoch (None: the datasets' sizes summed).
    - ``mix_classes``: a mix whose ``label`` class lists differ: "equal" refuses, "union"
      remaps the labels into one list.

    An unknown keyword raises ``TypeError`` naming it and the closest option.
    """
    options = {name: value for name, value in locals().items()  # what the caller changed
               if name in _DEFAULTS and not _same(value, _DEFAULTS[name])}
    world = world or World.detect()
    cfg = LoaderConfig(batch_size=batch_size, **options)
    if isinstance(source, (list, tuple, Mapping)):
        reader: DatasetReader = open_mix(source, cfg)
    elif cfg.weights is not None or cfg.epoch_size is not None:
        raise ConfigError("weights and epoch_size mix several datasets: pass a list of them "
                          "(make_loader([a, b], ..., weights=[0.7, 0.3]))", option="weights")
    else:
        reader = source if isinstance(source, DatasetReader) else open_dataset(
            source, cache_dir=cfg.cache_dir, cache_limit=cfg.cache_limit,  # type: ignore[arg-type]
            storage_options=cfg.storage_options, timeout=cfg.timeout)  # lists: mixes, above
    reader.require_samples("make_loader")
    device = _device(cfg.device)
    fields = cfg.fields_in(reader.schema)
    images = [f for f in (reader.schema[n] for n in fields if n in reader.schema)
              if isinstance(f, ImageField)]
    decodes = any(f.codec != "raw" for f in images)
    warn_meta(reader.root, cfg, reader.schema, fields, images)
    if cfg.num_workers == "tune":  # either backend: autotune measures the one chosen here
        if _tuner is None:
            raise ConfigError("num_workers='tune' is measured by feedpipe.tools.tune.autotune: "
                              "call feedpipe.make_loader (it loads the tuner), or import "
                              "feedpipe.tools.tune first", option="num_workers")
        tuned = _tuner(reader, batch_size, world=world,
                       **{k: v for k, v in options.items() if k != "num_workers"})
        cfg = replace(cfg, **tuned.loader_options())
    if choose_backend(reader, cfg, device) == "dali":
        return _named(dali_loader(reader, cfg, world, device), reader)  # resolves its "auto"s
    cfg = cfg.resolve(cuda=device.type == "cuda", decodes=decodes)
    log.info("feedpipe loader: %s (%s), %d samples, rank %d/%d, device %s, workers %s, "
             "jpeg decoder %s", reader.root, reader.format_name, len(reader), world.rank,
             world.size, device, cfg.num_workers, decoder_info()["jpeg_decoder"])
    jpeg = any(f.codec == "jpeg" for f in images)
    decode_on = cfg.decode_on
    for name in ("transform", "affine"):  # these need the decoded pixels in the workers
        if getattr(cfg, name) is not None:
            if decode_on == "device":
                raise ConfigError(f"{name}= runs in the workers on decoded images; "
                                  "decode_on='device' leaves them encoded there: use "
                                  "decode_on='cpu' (or 'auto')", option="decode_on")
            decode_on = "cpu"
    return _named(TorchLoader(reader, cfg, world, device,
                              choose_decoder(decode_on, device, jpeg)), reader)


def _named(loader: Loader, reader: DatasetReader) -> Loader:
    """A mix's loader says which dataset each ``source`` value stands for."""
    if isinstance(reader, MixedReader):
        loader.source_names = reader.names  # type: ignore[attr-defined]
    return loader


__all__ = ["DaliLoader", "Loader", "LoaderConfig", "LoaderView", "TorchLoader", "auto_workers",
           "make_loader", "set_tuner", "usable_cores"]
